"""Tenant isolation as a property (hypothesis, no I/O): whatever two tenants send, their requests never
share a block hash (routing state) nor an SGLang cache namespace (``cache_salt + extra_key``); and the
parts around it: API key files, rate-limit buckets, the reserved salt prefix."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import given, settings

from proxy.errors import InvalidRequest, RateLimited
from proxy.front.openai import parse_request
from proxy.tenancy.keys import ApiKey, ApiKeysError, load_keys
from proxy.tenancy.namespace import TENANT_PREFIX, isolate, tenant_salt
from proxy.tenancy.rate_limit import RateLimiter
from proxy.types import ParsedRequest, Route
from routing.canonical import namespace_salt, render
from routing.hashing import block_hashes

BLOCK = 16  # small blocks: short generated prompts still hash several
text = st.text(max_size=200)
salt = st.one_of(st.none(), st.text(max_size=40))
tenants = st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=2, unique=True)


@st.composite
def bodies(draw: st.DrawFn, route: Route) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m"}
    if route is Route.CHAT:
        body["messages"] = [{"role": "user", "content": draw(text)} for _ in range(draw(st.integers(1, 3)))]
    elif route is Route.COMPLETIONS:
        body["prompt"] = draw(text)
    else:
        body["text"] = draw(text)
    for field in ("cache_salt", "extra_key"):
        value = draw(salt)
        if value is not None:
            body[field] = value
    return body


def _isolated(route: Route, body: dict[str, Any], tenant: str) -> tuple[ParsedRequest, dict[str, Any]]:
    parsed, raw = isolate(parse_request(route, orjson.dumps(body)), orjson.dumps(body), tenant)
    return parsed, orjson.loads(raw)


def _hashes(p: ParsedRequest) -> set[int]:
    data = render(p.routing.prompt).encode()
    return set(block_hashes("m", data, namespace_salt(p.routing.namespace), BLOCK, 1000))


def _sglang_key(route: Route, sent: dict[str, Any]) -> str:
    """SGLang's cache namespace of what it receives (contract §8)."""
    if route is Route.GENERATE:
        return str(sent.get("extra_key") or "")
    return str(sent.get("cache_salt") or "") + str(sent.get("extra_key") or "")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([Route.CHAT, Route.COMPLETIONS, Route.GENERATE]), tenants, st.data())
def test_two_tenants_never_share_a_block_or_a_kv_namespace(
    route: Route, pair: list[str], data: st.DataObject
) -> None:
    a_body = data.draw(bodies(route))
    b_body = data.draw(st.one_of(bodies(route), st.just(a_body)))  # B may send exactly what A sent
    if data.draw(st.booleans()):  # or A's forced salt, as its own
        b_body = b_body | {("extra_key" if route is Route.GENERATE else "cache_salt"): tenant_salt(pair[0])}
    (pa, sent_a), (pb, sent_b) = _isolated(route, a_body, pair[0]), _isolated(route, b_body, pair[1])
    assert not _hashes(pa) & _hashes(pb)
    ka, kb = _sglang_key(route, sent_a), _sglang_key(route, sent_b)
    assert ka.startswith(tenant_salt(pair[0])) and kb.startswith(tenant_salt(pair[1]))
    assert not ka.startswith(tenant_salt(pair[1])) and not kb.startswith(tenant_salt(pair[0]))


def test_without_a_tenant_the_body_is_untouched_and_the_prefix_reserved() -> None:
    raw = orjson.dumps({"model": "m", "prompt": "x", "cache_salt": "mine"})
    parsed = parse_request(Route.COMPLETIONS, raw)
    assert isolate(parsed, raw, "") == (parsed, raw)
    for body in ({"cache_salt": TENANT_PREFIX + "x"}, {"cache_salt": "kvroute-", "extra_key": "tenant-y"}):
        reserved = orjson.dumps({"model": "m", "prompt": "x", **body})
        with pytest.raises(InvalidRequest):
            isolate(parse_request(Route.COMPLETIONS, reserved), reserved, "")
    bad = orjson.dumps({"model": "m", "prompt": "x", "cache_salt": 3})
    with pytest.raises(InvalidRequest):
        isolate(parse_request(Route.COMPLETIONS, bad), bad, "acme")


def test_key_files_in_every_format(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"k2").hexdigest()
    (tmp_path / "k.toml").write_text(f'[[key]]\nkey = "k1"\ntenant = "t"\n[[key]]\nsha256 = "{digest}"\n')
    (tmp_path / "k.jsonl").write_text('# comment\n{"key": "k1", "tenant": "t", "requests_per_minute": 5}\n')
    for ring in (
        load_keys(str(tmp_path / "k.toml")),
        load_keys(f'[{{"sha256": "{digest}"}}, {{"key": "k1"}}]'),
    ):
        assert len(ring) == 2 and ring.authenticate("Bearer k2") is not None
        assert ring.authenticate("Bearer k3") is None and ring.authenticate("k2") is None
    key = load_keys(str(tmp_path / "k.jsonl")).authenticate("bearer  k1")
    assert key == ApiKey(hashlib.sha256(b"k1").hexdigest(), "t", 5, 0)


@pytest.mark.parametrize(
    "content",
    [
        '{"key": "SECRET", "sha256": "00"}',
        '{"sha256": "SECRET"}',
        '{"key": "SECRET", "requests_per_minute": -1}',
        '{"key": "SECRET", "tenat": "t"}',
        '{"key": "SECRET", "tenant": "t", "requests_per_minute": 1}\n{"key": "SECRET2", "tenant": "t"}',
        "not json SECRET",
        "[]",
    ],
)
def test_bad_key_files_are_refused_without_echoing_keys(tmp_path: Path, content: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ApiKeysError) as e:
        load_keys(str(path))
    assert "SECRET" not in str(e.value)


def test_buckets_refill_and_settle_with_usage() -> None:
    limiter, key = RateLimiter(), ApiKey("0" * 64, "t", requests_per_minute=60, tokens_per_minute=600)
    limiter.admit(key, 500, now=0.0)
    with pytest.raises(RateLimited) as e:
        limiter.admit(key, 500, now=0.0)  # 100 left: 400 more take 40 s
    assert e.value.retry_after == 40
    limiter.settle(key, 500, 100)  # it used 100: 400 come back
    limiter.admit(key, 500, now=0.0)
    limiter.admit(key, 10_000, now=60.0)  # bigger than a minute's allowance: passes on a full bucket
    with pytest.raises(RateLimited):
        limiter.admit(key, 1, now=61.0)
