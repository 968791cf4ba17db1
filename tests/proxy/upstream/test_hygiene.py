"""Hostile input and headers: limits on messages, string sizes and JSON depth (OpenAI-shaped 400/413
naming the limit); hop-by-hop and kvroute's own headers never relayed, the upstream address out of the
client's hands; no prompt text in kvroute's logs, access log on."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from proxy.upstream.relay import forward_headers, response_headers
from tests.proxy.conftest import MODEL, StackFactory

CANARY = "PROMPT-CANARY-7f3a"


def _chat(messages: int = 1, content: str = "hi", **extra: Any) -> dict[str, Any]:
    msgs = [{"role": "user", "content": content} for _ in range(messages)]
    return {"model": MODEL, "messages": msgs, "max_tokens": 2, **extra}


async def test_input_limits_name_the_limit(stack_factory: StackFactory) -> None:
    stack = await stack_factory(1, max_messages=3, max_field_bytes=1000, max_json_depth=8)
    deep: Any = 1
    for _ in range(8):
        deep = [deep]
    cases = [
        (_chat(messages=4), 400, "too_many_messages", "max_messages"),
        (_chat(content="é" * 600), 413, "field_too_large", "max_field_bytes"),  # 1200 UTF-8 bytes
        (_chat(metadata={"k" * 1001: 1}), 413, "field_too_large", "max_field_bytes"),
        (_chat(metadata={"a": deep}), 400, "too_deep", "max_json_depth"),
    ]
    async with aiohttp.ClientSession() as s:
        for body, status, code, setting in cases:
            async with s.post(stack.url + "/v1/chat/completions", json=body) as r:
                assert r.status == status, body
                err = (await r.json())["error"]
                assert err["code"] == code and setting in err["message"]
        for ok in (_chat(messages=3, content="x" * 400), _chat(metadata={"a": [[[[1]]]]})):
            async with s.post(stack.url + "/v1/chat/completions", json=ok) as r:
                assert r.status == 200
    assert len(await stack.generations()) == 2


async def test_hop_by_hop_and_own_headers_never_reach_the_replica(stack_factory: StackFactory) -> None:
    stack = await stack_factory(1)
    sent = {
        "Connection": "keep-alive, X-Private-Hop",
        "X-Private-Hop": "1",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Proxy-Authorization": "Basic eA==",
        "Host": "evil.example:1",
        "X-Forwarded-For": "6.6.6.6",
        "X-Forwarded-Host": "evil.example",
        "Forwarded": "for=6.6.6.6;host=evil.example",
        "X-Real-IP": "6.6.6.6",
        "x-kvroute-replica": "spoofed",
        "X-Kept": "yes",
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/chat/completions", json=_chat(), headers=sent) as r,
    ):
        assert r.status == 200 and r.headers["x-kvroute-replica"] == stack.urls[0]
    (entry,) = await stack.generations()
    got = {k.lower(): v for k, v in entry["headers"].items()}
    assert got["x-kept"] == "yes" and got["host"] == stack.urls[0].removeprefix("http://")
    gone = {k.lower() for k in sent} - {"x-kept", "host", "connection"}  # the gateway's own Connection
    assert not gone & set(got), gone & set(got)
    assert "x-private-hop" not in got.get("connection", "").lower()


def test_a_replicas_own_kvroute_headers_are_dropped() -> None:
    upstream = CIMultiDict(
        {"Connection": "close, X-Hop", "X-Hop": "1", "x-kvroute-cache": "hit", "Content-Type": "a/b"}
    )
    out = response_headers(upstream, {"x-kvroute-replica": "r1"})
    assert dict(out) == {"Content-Type": "a/b", "x-kvroute-replica": "r1"}
    assert dict(forward_headers(CIMultiDict({"X-Forwarded-Proto": "https", "A": "1"}), {})) == {"A": "1"}


async def test_no_prompt_text_in_kvroute_logs(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stack = await stack_factory(1, access_log=True)
    async with aiohttp.ClientSession() as s:
        for body in (
            orjson.dumps(_chat(content=CANARY)).decode(),  # valid
            '{"model": "' + MODEL + '", "messages": [{"role": "user", "content": "' + CANARY + '"}',  # cut
            '{"model": 7, "messages": "' + CANARY + '"}',
        ):
            async with s.post(
                stack.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
    ours = [r for r in caplog.records if r.name.startswith(("kvroute", "aiohttp"))]
    assert any(r.name == "kvroute.access" for r in ours)
    assert not [r.getMessage() for r in ours if CANARY in r.getMessage()]
