"""Tenants kept whole (the security review's tenant findings): sessions, the response cache and warm-ups
are per tenant (or per key without one), and a warm-up lands in the namespace of the tenant it is for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.front.openai import parse_request
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.namespace import scoped_session
from proxy.types import Route
from tests.proxy.conftest import ADMIN, MODEL, Stack, StackFactory, wait_for
from tests.proxy.warm.test_warmup import document, warm

KEYS = {"acme": "sk-acme", "globex": "sk-globex", "plain1": "sk-plain-1", "plain2": "sk-plain-2"}
ENTRIES = [
    {"key": KEYS["acme"], "tenant": "acme"},
    {"key": KEYS["globex"], "tenant": "globex", "tokens_per_minute": 100},
    {"key": KEYS["plain1"]},
    {"key": KEYS["plain2"]},
]
JSON = {"Content-Type": "application/json"}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


async def keyed(stack_factory: StackFactory, tmp_path: Path, n: int = 1, **settings: Any) -> Stack:
    path = tmp_path / "keys.jsonl"
    path.write_text("\n".join(orjson.dumps(e).decode() for e in ENTRIES))
    return await stack_factory(n, api_keys=str(path), **settings)


async def chat(stack: Stack, who: str, messages: list[dict[str, str]], **extra: Any) -> tuple[int, Any, Any]:
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 2} | extra)
    headers = JSON | (auth(who) if who else {})
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        return r.status, await r.json(), r.headers


def cached(doc: Any) -> int:
    details = doc["usage"]["prompt_tokens_details"]
    return int(details["cached_tokens"]) if details else 0


def test_a_session_key_is_scoped_to_its_client() -> None:
    parsed = parse_request(Route.CHAT, b'{"model":"m","messages":[{"role":"user","content":"q"}]}', "s1")
    keys = [ApiKey("a" * 64, "acme"), ApiKey("b" * 64, "globex"), ApiKey("c" * 64), ApiKey("d" * 64)]
    sessions = [scoped_session(parsed, k).routing.session for k in keys]
    assert len(set(sessions)) == 4 and all(s is not None and s.endswith("\x00s1") for s in sessions)


async def test_one_session_id_from_two_tenants_is_two_sessions(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    """acme's conv-1 sticks (reason ``session``); globex's conv-1 is a new session, not acme's."""
    stack = await keyed(stack_factory, tmp_path, n=2, policy="cost")
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    reasons = []
    async with aiohttp.ClientSession() as s:
        for who in ("acme", "acme", "globex", "globex"):
            before = stack.gw.metrics.history.decisions()
            headers = JSON | auth(who) | {"x-session-id": "conv-1"}
            async with s.post(stack.url + "/v1/chat/completions", data=body, headers=headers) as r:
                assert r.status == 200
            seen = len(before)
            await wait_for(lambda: len(stack.gw.metrics.history.decisions()) > seen)  # noqa: B023
            reasons.append(stack.gw.metrics.history.decisions()[0].reason)
    assert reasons[1] == "session" and reasons[2] != "session" and reasons[3] == "session"


async def test_two_keys_without_a_tenant_never_share_a_cached_answer(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await keyed(stack_factory, tmp_path, response_cache="memory")
    messages = [{"role": "user", "content": "a deterministic question"}]
    results = [await chat(stack, who, messages, temperature=0) for who in ("plain1", "plain1", "plain2")]
    assert [h["x-kvroute-cache"] for _, _, h in results] == ["miss", "hit", "miss"]


async def test_a_tenant_warms_its_own_namespace(stack_factory: StackFactory, tmp_path: Path) -> None:
    """Warmed with acme's key: a hit for acme's requests, a miss for globex's and for a key without a
    tenant; warmed by the admin for acme: the same; the warm-up shows its tenant, never its text."""
    stack = await keyed(stack_factory, tmp_path)
    text = document(11, 600)
    messages = [{"role": "system", "content": text}, {"role": "user", "content": "question"}]
    body = {"model": MODEL, "documents": [{"messages": messages[:1]}], "wait": True}
    status, job = await warm(stack.url, body, auth("acme"))
    assert status == 200 and job["tenant"] == "acme" and job["documents"][0]["status"] == "warm"
    hits = {who: cached((await chat(stack, who, messages))[1]) for who in ("globex", "plain1", "acme")}
    assert hits["acme"] > 500 and hits["globex"] == 0 and hits["plain1"] == 0
    other = [{"role": "system", "content": document(12, 600)}, {"role": "user", "content": "q"}]
    body = {"model": MODEL, "documents": [{"messages": other[:1]}], "wait": True, "tenant": "acme"}
    status, job = await warm(stack.url, body, ADMIN)
    assert status == 200 and job["tenant"] == "acme"
    assert cached((await chat(stack, "plain1", other))[1]) == 0
    assert cached((await chat(stack, "acme", other))[1]) > 500
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        section = (await r.json())["warmup"]["documents"]
        assert {d["tenant"] for d in section} == {"acme"} and text[:40] not in orjson.dumps(section).decode()


async def test_warmup_jobs_are_scoped_to_their_owner(stack_factory: StackFactory, tmp_path: Path) -> None:
    stack = await keyed(stack_factory, tmp_path)
    status, mine = await warm(
        stack.url, {"model": MODEL, "documents": [{"text": "acme's doc " * 40}]}, auth("acme")
    )
    assert status == 202
    async with aiohttp.ClientSession() as s:
        for who, want in (("acme", 200), ("plain1", 404)):
            async with s.get(stack.url + f"/v1/warmup/{mine['id']}", headers=auth(who)) as r:
                assert r.status == want
            async with s.get(stack.url + "/v1/warmup", headers=auth(who)) as r:
                assert [j["id"] for j in (await r.json())["data"]] == ([mine["id"]] if want == 200 else [])
        async with s.delete(stack.url + f"/v1/warmup/{mine['id']}", headers=auth("globex")) as r:
            assert r.status == 404
        async with s.get(stack.url + "/v1/warmup", headers=ADMIN) as r:
            assert [j["id"] for j in (await r.json())["data"]] == [mine["id"]]
        async with s.delete(stack.url + f"/v1/warmup/{mine['id']}", headers=auth("acme")) as r:
            assert r.status == 200


@pytest.mark.parametrize(
    ("who", "extra", "status", "code"),
    [
        ("acme", {"tenant": "globex"}, 403, None),
        ("admin", {"tenant": "nobody"}, 400, None),
        ("admin", {"tennant": "acme"}, 400, None),
        ("acme", {"documents": [{"text": "x", "cache": True}]}, 400, None),
        ("admin", {"cache_salt": "kvroute-tenant-0123:"}, 400, None),
        ("", {}, 401, None),
    ],
)
async def test_warmup_refusals(
    stack_factory: StackFactory,
    tmp_path: Path,
    who: str,
    extra: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    stack = await keyed(stack_factory, tmp_path)
    body = {"model": MODEL, "documents": [{"text": "a document " * 200}]} | extra
    headers = ADMIN if who == "admin" else auth(who) if who else {}
    got, doc = await warm(stack.url, body, headers)
    assert got == status, doc
    if code is not None:
        assert doc["error"]["code"] == code
    assert await _jobs(stack) == []


async def test_a_warmup_is_charged_to_the_keys_limits(stack_factory: StackFactory, tmp_path: Path) -> None:
    stack = await keyed(stack_factory, tmp_path)  # globex: 100 tokens per minute
    body = {"model": MODEL, "documents": [{"text": "a document " * 200}]}
    assert (await warm(stack.url, body, auth("globex")))[0] == 202
    status, doc = await warm(stack.url, body, auth("globex"))
    assert status == 429 and doc["error"]["code"] == "rate_limit_exceeded"


async def test_a_tenants_warmed_tokens_are_bounded(stack_factory: StackFactory, tmp_path: Path) -> None:
    stack = await keyed(stack_factory, tmp_path, warmup_max_tokens_per_tenant=400)
    small = {"model": MODEL, "documents": [{"text": document(3, 60)}]}
    status, first = await warm(stack.url, small, auth("acme"))
    assert status == 202
    status, doc = await warm(
        stack.url, {"model": MODEL, "documents": [{"text": document(4, 300)}]}, auth("acme")
    )
    assert status == 429 and doc["error"]["code"] == "warmup_quota_exceeded"
    assert [j["id"] for j in await _jobs(stack)] == [first["id"]]
    status, _ = await warm(stack.url, {"model": MODEL, "documents": [{"text": document(4, 300)}]}, ADMIN)
    assert status == 202  # the admin's tenant-less jobs are not a tenant's


async def _jobs(stack: Stack) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/warmup", headers=ADMIN) as r:
        jobs: list[dict[str, Any]] = (await r.json())["data"]
        return jobs
