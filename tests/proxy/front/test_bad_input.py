"""Hostile and malformed input on every route of a real gateway in front of emulated replicas: never a
5xx of kvroute's own making, never a crash, every rejection OpenAI-shaped with the right status.

A replica's own answer relayed by kvroute is allowed any status (it carries ``x-kvroute-replica``); an
answer kvroute made itself has no such header and must be a 4xx ``{"error": {message, type, param,
code}}``. After each batch the gateway still serves a normal request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

import orjson
import pytest

from bench.systems.procs import ManagedProcess, free_ports
from tests.proxy.badinput import (
    BAD_BODIES,
    FIELD_VALUES,
    ROUTE_FIELDS,
    ROUTES,
    assert_clean,
    assert_serves,
    is_openai_error,
    kvroute_made,
    send,
)
from tests.proxy.conftest import ADMIN, MODEL, StackFactory, wait_for

LIMIT = 1024 * 1024
IDLE_CONNECTIONS = 2000


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


@pytest.mark.parametrize(
    ("content_type", "raw", "code"),
    [
        ("application/json; charset=utf-8", None, None),
        ("text/plain", None, "unsupported_content_type"),  # OpenAI and SGLang take JSON only
        (None, None, "unsupported_content_type"),
        ("application/x-www-form-urlencoded", b"model=emu-model&prompt=hi", "unsupported_content_type"),
        ("multipart/form-data; boundary=x", b"--x\r\n\r\nhi\r\n--x--\r\n", "unsupported_content_type"),
        ("application/json; charset=latin-1", b'{"model": "emu-model", "prompt": "caf\xe9"}', None),
    ],
)
async def test_content_types(url: str, content_type: str | None, raw: bytes | None, code: str | None) -> None:
    raw = raw or orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1})
    status, body, headers = await send(url, "/v1/completions", raw, content_type=content_type)
    assert_clean(status, body, headers, content_type)
    if raw.startswith(b"{") and b"\xe9" not in raw:
        assert status == (200 if code is None else 400), body[:300]
    else:
        assert status == 400, body[:300]
    if code is not None:
        assert orjson.loads(body)["error"]["code"] == code


async def _drip(url: str, path: str, stop_after_s: float) -> tuple[bytes, bool]:
    """Headers, then one body byte every 50 ms: (what the gateway answered, whether it then closed)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
    )
    writer.write(head.encode())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + stop_after_s
    answer = b""
    try:
        while loop.time() < deadline and not answer:
            writer.write(b" ")
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(65536), 0.05)
        rest = await asyncio.wait_for(reader.read(), 5.0)  # EOF: the gateway closed the connection
        return answer + rest, True
    except (ConnectionError, TimeoutError):
        return answer, False
    finally:
        writer.close()


async def test_a_slow_drip_body_gets_408_and_the_connection_closes(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, body_timeout=0.5)
    for path in ("/v1/chat/completions", "/generate", "/v1/embeddings", "/admin/replicas"):
        answer, closed = await _drip(stack.url, path, stop_after_s=10.0)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), (path, answer[:300])
        assert is_openai_error(body) and closed, (path, answer[:300])
    await assert_serves(stack.url)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _open_idle(port: int, n: int) -> list[Conn]:
    """n connections; every other one sends the start of a request and stops."""
    conns = []
    for i in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        if i % 2:
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        conns.append((r, w))
    return conns


def _gateway(backend: str, *flags: str) -> ManagedProcess:
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--backend", backend, *flags]
    return ManagedProcess(argv, [f"http://127.0.0.1:{port}"])


async def test_thousands_of_idle_connections(stack_factory: StackFactory) -> None:
    """2000 idle sockets: the gateway still answers, and its fds come back once they close."""
    stack = await stack_factory(n=1)
    async with _gateway(stack.urls[0]) as gw:
        pid, port = gw.pid or 0, int(gw.urls[0].rsplit(":", 1)[1])
        base = _fds(pid)
        conns = await _open_idle(port, IDLE_CONNECTIONS)
        await wait_for(lambda: _fds(pid) >= base + IDLE_CONNECTIONS, 20.0)
        await assert_serves(gw.urls[0])
        for _, w in conns:
            w.close()
        await wait_for(lambda: _fds(pid) <= base + 2, 20.0)


async def test_idle_connections_are_closed_after_the_idle_timeout(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    async with _gateway(stack.urls[0], "--client-idle-timeout", "0.5") as gw:
        conns = await _open_idle(int(gw.urls[0].rsplit(":", 1)[1]), 20)
        await wait_for(lambda: all(r.at_eof() for r, _ in conns), 10.0)  # the gateway closed them
        for _, w in conns:
            w.close()
        await assert_serves(gw.urls[0])


async def test_a_valid_admin_body_still_reaches_its_handler(stack_factory: StackFactory) -> None:
    """The body middleware reads every body first; the admin API must still see it."""
    stack = await stack_factory(n=1)
    doc = {"url": stack.urls[0], "draining": False}
    status, body, _ = await send(stack.url, "/admin/replicas/drain", orjson.dumps(doc), ADMIN)
    assert status == 200 and orjson.loads(body)["replica"]["draining"] is False, body[:300]
