"""Hostile and malformed input on every route of a real gateway in front of emulated replicas: never a
5xx of kvroute's own making, never a crash, every rejection OpenAI-shaped with the right status.

A replica's own answer relayed by kvroute is allowed any status (it carries ``x-kvroute-replica``); an
answer kvroute made itself has no such header and must be a 4xx ``{"error": {message, type, param,
code}}``. After each batch the gateway still serves a normal request.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.proxy.badinput import (
    BAD_BODIES,
    FIELD_VALUES,
    ROUTE_FIELDS,
    ROUTES,
    assert_clean,
    assert_serves,
    kvroute_made,
    send,
)
from tests.proxy.conftest import ADMIN, MODEL, StackFactory

LIMIT = 1024 * 1024


@pytest.fixture
async def url(stack_factory: StackFactory) -> str:
    stack = await stack_factory(n=1, max_body_bytes=LIMIT)
    return stack.url


async def test_malformed_bodies_on_every_route_are_clean_400s(url: str) -> None:
    for path in ROUTES:
        for name, raw in BAD_BODIES.items():
            status, body, headers = await send(url, path, raw, ADMIN)
            assert_clean(status, body, headers, (path, name))
            if kvroute_made(headers) and path != "/flush_cache":  # it takes no body
                assert status in (400, 401, 403, 404, 405), (path, name, status, body[:200])
    await assert_serves(url)


async def test_wrong_types_for_every_field_kvroute_reads(url: str) -> None:
    for path, base in ROUTE_FIELDS.items():
        for key in [*base, "stream", "n", "cache_salt", "extra_key", "lora_path", "rid", "tools"]:
            for value in FIELD_VALUES:
                doc: dict[str, Any] = {**base, key: value}
                status, body, headers = await send(url, path, orjson.dumps(doc), ADMIN)
                assert_clean(status, body, headers, (path, key, value))
    await assert_serves(url)


async def test_nested_fields_of_a_chat_request(url: str) -> None:
    path = "/v1/chat/completions"
    for value in FIELD_VALUES:
        messages = [
            {"role": "user", "content": value},
            {"role": "assistant", "content": "x", "tool_calls": value, "name": value},
            {"role": "tool", "content": [value], "tool_call_id": value},
        ]
        for extra in ({}, {"tools": [value]}, {"chat_template_kwargs": value}, {"stream_options": value}):
            doc = {"model": MODEL, "messages": messages, "max_tokens": 1, **extra}
            status, body, headers = await send(url, path, orjson.dumps(doc))
            assert_clean(status, body, headers, (extra, value))
    await assert_serves(url)


async def test_a_body_over_the_limit_is_413_on_every_route(url: str) -> None:
    big = b'{"model": "' + b"x" * LIMIT + b'"}'
    for path in ROUTES:
        status, body, headers = await send(url, path, big, ADMIN)
        assert_clean(status, body, headers, path)
        assert status == 413, (path, status)
    await assert_serves(url)


async def test_unknown_fields_are_forwarded_untouched(url: str) -> None:
    doc = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi", "zz_unknown": [1, {"a": None}]}],
        "max_tokens": 1,
        "zz_unknown": {"deep": [1.5e300, -0.0, "\u202e\U0001f600"]},
    }
    status, body, _ = await send(url, "/v1/chat/completions", orjson.dumps(doc))
    assert status == 200, body[:300]
