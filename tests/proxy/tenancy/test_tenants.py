"""Client API keys and tenant isolation through a real gateway and emulated replicas: 401 without a
known key, the tenant's salt forced into SGLang's ``cache_salt`` (a tenant cannot reach another's), the
Authorization header kept from the replicas, rate limits (429 + Retry-After), and a timing test: tenant
B's TTFT on a prefix tenant A already sent is not that of a cache hit."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.tenancy.namespace import tenant_salt
from tests.conftest import sha256
from tests.proxy.conftest import ADMIN, MODEL, Stack, StackFactory

KEYS = {"a": "sk-tenant-a", "b": "sk-tenant-b", "c": "sk-no-tenant", "slow": "sk-two-per-minute"}


def _keys_file(tmp_path: Path) -> str:
    lines = [
        {"key": KEYS["a"], "tenant": "acme"},
        {"sha256": sha256(KEYS["b"].encode()), "tenant": "globex"},
        {"key": KEYS["c"]},
        {"key": KEYS["slow"], "tenant": "tiny", "requests_per_minute": 2, "tokens_per_minute": 1000},
    ]
    path = tmp_path / "keys.jsonl"
    path.write_text("\n".join(orjson.dumps(x).decode() for x in lines))
    return str(path)


def _auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


async def _chat(
    s: aiohttp.ClientSession, stack: Stack, who: str, text: str, **extra: Any
) -> tuple[int, dict[str, Any], bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2, **extra}
    raw = orjson.dumps(body)
    headers = _auth(who) | {"Content-Type": "application/json"}
    async with s.post(stack.url + "/v1/chat/completions", data=raw, headers=headers) as r:
        return r.status, await r.json(), raw


async def test_a_known_key_is_needed_on_the_client_api_only(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(1, api_keys=_keys_file(tmp_path))
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEYS["a"]}):
            async with s.post(stack.url + "/v1/completions", json=body, headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["error"] | {"message": ""} == {
                    "message": "",
                    "type": "authentication_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
        async with s.get(stack.url + "/v1/models") as r:
            assert r.status == 401
        async with s.get(stack.url + "/v1/models", headers=_auth("c")) as r:
            assert r.status == 200
        async with s.get(stack.url + "/v1/models", headers=ADMIN) as r:
            assert r.status == 200  # the operator may list models (kvroute warm asks which to warm)
        async with s.post(stack.url + "/v1/completions", json=body, headers=ADMIN) as r:
            assert r.status == 401  # but generates nothing: the admin key is not a client key
        async with s.post(stack.url + "/generate", json={"text": "hi"}, headers=_auth("b")) as r:
            assert r.status == 200
        async with s.get(stack.url + "/health") as r:
            assert r.status == 200
        for path in ("/status", "/metrics"):  # behind the admin key (the stack has one), not a client key
            async with s.get(stack.url + path, headers=_auth("a")) as r:
                assert r.status == 401
            async with s.get(stack.url + path, headers=ADMIN) as r:
                assert r.status == 200
        async with s.get(stack.url + "/admin/replicas", headers=_auth("a")) as r:
            assert r.status == 401  # a client key is not the admin key
        async with s.get(stack.url + "/admin/replicas", headers=ADMIN) as r:
            assert r.status == 200
        async with s.get(stack.url + "/v1/warmup", headers=ADMIN) as r:
            assert r.status == 200  # under /v1/ with its own keys: the admin key or a client key
        async with s.get(stack.url + "/v1/warmup") as r:
            assert r.status == 401
    assert 'kvroute_rejections_total{reason="unauthorized"} 5' in stack.metrics()  # and the admin key's POST


async def test_the_tenant_salt_is_forced_and_cannot_be_reached(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(1, api_keys=_keys_file(tmp_path))
    doc = "A long shared document about tenancy. " * 40
    a_salt = tenant_salt("acme")
    async with aiohttp.ClientSession() as s:
        first = await _chat(s, stack, "a", doc)
        assert first[0] == 200, first
        status, warm, raw = await _chat(s, stack, "a", doc)
        assert status == 200 and warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # tenant B sends A's salt, and A's prompt: it lands after B's own salt, and misses
        status, cold, raw_b = await _chat(s, stack, "b", doc, cache_salt=a_salt)
        assert status == 200 and cold["usage"]["prompt_tokens_details"] is None
        # a key without a tenant may not use the reserved prefix at all
        status, err, _ = await _chat(s, stack, "c", doc, cache_salt=a_salt)
        assert status == 400 and err["error"]["param"] == "cache_salt"
        assert (await _chat(s, stack, "c", doc, cache_salt="mine"))[0] == 200  # its own salt, as sent
    got = await stack.generations()
    sent_a = orjson.dumps(orjson.loads(raw) | {"cache_salt": a_salt})
    sent_b = orjson.dumps(orjson.loads(raw_b) | {"cache_salt": tenant_salt("globex") + a_salt})
    assert got[1]["body_sha256"] == sha256(sent_a) and got[2]["body_sha256"] == sha256(sent_b)
    assert all("authorization" not in {k.lower() for k in e["headers"]} for e in got)
    assert len(got) == 4


async def test_rate_limits_answer_429_with_retry_after(stack_factory: StackFactory, tmp_path: Path) -> None:
    stack = await stack_factory(1, api_keys=_keys_file(tmp_path))
    async with aiohttp.ClientSession() as s:
        assert [(await _chat(s, stack, "slow", f"q{i}"))[0] for i in range(2)] == [200, 200]
        async with s.post(
            stack.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "q3"}]},
            headers=_auth("slow"),
        ) as r:
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"]["code"] == "rate_limit_exceeded"
        assert (await _chat(s, stack, "a", "other tenants are not limited"))[0] == 200
    assert 'kvroute_rejections_total{reason="rate_limited"} 1' in stack.metrics()


async def _ttft(s: aiohttp.ClientSession, stack: Stack, who: str, text: str) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True}
    t0 = time.perf_counter()
    async with s.post(stack.url + "/v1/chat/completions", json=body, headers=_auth(who)) as r:
        assert r.status == 200
        await r.content.readany()
        ttft = time.perf_counter() - t0
        await r.read()
    return ttft


async def test_timing_does_not_reveal_another_tenants_prefix(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    """Measured through kvroute on one replica (so only the salt keeps tenants apart), prefill made
    visible (--emu-time-scale 0.05: a ~6K-token cold prefill ~50 ms, a hit ~12 ms). The control shows the
    measurement tells a hit: A's own repeat is fast. B on A's prefix is as slow as B on a fresh one."""
    stack = await stack_factory(1, emu_flags=("--emu-time-scale", "0.05"), api_keys=_keys_file(tmp_path))
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    docs = [" ".join(f"{w}{i}{j}" for j in range(150) for w in words) for i in range(6)]
    a_warm, b_seen, b_fresh = [], [], []
    async with aiohttp.ClientSession() as s:
        for i in range(3):
            await _ttft(s, stack, "a", docs[i])  # A warms its own cache with doc i
            a_warm.append(await _ttft(s, stack, "a", docs[i]))
            b_seen.append(await _ttft(s, stack, "b", docs[i]))  # the prefix A sent
            b_fresh.append(await _ttft(s, stack, "b", docs[3 + i]))  # a prefix nobody sent
            await asyncio.sleep(0)
    seen, fresh, warm = (statistics.median(x) for x in (b_seen, b_fresh, a_warm))
    assert warm < 0.5 * fresh, (warm, fresh)  # the control: a hit is visible in TTFT
    assert seen > 0.7 * fresh, (seen, fresh)  # B's TTFT on A's prefix is a miss's
