"""Bad inputs for the gateway and the checks every answer to one must pass
(tests/proxy/front/test_bad_input.py, tests/proxy/front/test_fuzz.py and ``bench.labs.fuzz`` share them)."""

from __future__ import annotations

import io
from typing import Any

import aiohttp
import orjson

from bench.labs.fuzz_bodies import is_openai_error
from tests.proxy.conftest import MODEL

ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/v1/embeddings",  # pass-through
    "/v1/warmup",
    "/admin/replicas",
    "/admin/replicas/drain",
    "/flush_cache",
)
DEEP = 100_000
BAD_BODIES: dict[str, bytes] = {
    "empty": b"",
    "truncated": b'{"model": "emu-model", "messages": [',
    "trailing garbage": b'{"model": "emu-model"} xx',
    "not an object": b"[1, 2, 3]",
    "a string": b'"hello"',
    "null": b"null",
    "NaN": b'{"model": NaN}',
    "single quotes": b"{'model': 'emu-model'}",
    "deep arrays": b"[" * DEEP + b"]" * DEEP,
    "deep objects": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "deep in a field": b'{"model": "emu-model", "messages": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "invalid utf-8": b'{"model": "emu-\xff\xfe", "prompt": "\xc3\x28"}',
    "lone surrogate": b'{"model": "emu-model", "prompt": "\\ud800"}',
    "nul bytes": b'{"model": "emu-model"\x00}',
    "utf-16": '{"model": "emu-model"}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"model": "emu-model", "prompt": "hi"}',
    "huge number": b'{"model": "emu-model", "prompt": "hi", "max_tokens": 1' + b"0" * 400 + b"}",
    "huge exponent": b'{"model": "emu-model", "prompt": "hi", "temperature": 1e999999}',
}
# one valid body per route, the fields kvroute reads
ROUTE_FIELDS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "max_completion_tokens": 1,
    },
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "/generate": {"text": "hi", "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
    "/v1/warmup": {"model": MODEL, "documents": [{"text": "hi"}], "replicas": 1, "ttl": 1, "wait": False},
    "/admin/replicas/drain": {"url": "http://127.0.0.1:1", "draining": True},
}
FIELD_VALUES: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    1.5,
    -1e308,
    "",
    "x" * 1000,
    "\u0000\u202e\U0001f600\ufeff",
    [],
    [None],
    [[1, "a"], {"b": 2}],
    {},
    {"role": 1, "content": {"x": []}},
)


def kvroute_made(headers: dict[str, str]) -> bool:
    """An answer kvroute made itself (a replica's relayed answer names the replica)."""
    return "x-kvroute-replica" not in headers


def assert_clean(status: int, body: bytes, headers: dict[str, str], what: object) -> None:
    """No kvroute-made 5xx; every kvroute-made rejection is an OpenAI-shaped error."""
    if not kvroute_made(headers):
        return
    assert status < 500, (what, status, body[:300])
    if status >= 400:
        assert is_openai_error(body), (what, status, body[:300])
        assert headers.get("content-type", "").startswith("application/json"), (what, headers)


async def send(
    url: str,
    path: str,
    raw: bytes,
    headers: dict[str, str] | None = None,
    content_type: str | None = "application/json",
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, lower-cased headers) of one POST of ``raw`` (no Content-Type when None)."""
    hdrs = dict(headers or {}) | ({"Content-Type": content_type} if content_type else {})
    skip = () if content_type else ("Content-Type",)
    async with (
        aiohttp.ClientSession(skip_auto_headers=skip) as s,
        s.post(url + path, data=io.BytesIO(raw), headers=hdrs) as r,
    ):
        return r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()}


async def assert_serves(url: str) -> None:
    """The gateway still answers a normal request."""
    doc = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2}
    status, body, _ = await send(url, "/v1/chat/completions", orjson.dumps(doc))
    assert status == 200, body[:300]
