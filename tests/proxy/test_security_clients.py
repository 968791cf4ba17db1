"""The security review replayed on what a client sends besides its path: keys, credentials, headers,
the access log, a reader that stalls, and the bodies of the pass-through. What arrives at a recording
replica is asserted (docs/security.md)."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import Emulators, StartGateway, wait_for
from tests.proxy.conftest import EMU_FLAGS, MODEL
from tests.proxy.recorder import Recorder, raw_request

KEYS = [{"key": "sk-acme", "tenant": "acme"}, {"key": "sk-plain"}]
JSON = {"Content-Type": "application/json"}
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def _keys(tmp_path: Path) -> str:
    path = tmp_path / "keys.jsonl"
    path.write_text("\n".join(orjson.dumps(k).decode() for k in KEYS))
    return str(path)


@pytest.fixture
async def recorded(emulator_server: Emulators) -> AsyncIterator[tuple[Recorder, str]]:
    """One emulated replica behind a recorder: (the recorder, its URL)."""
    recorder = Recorder((await emulator_server(*EMU_FLAGS)).url)
    async with AsyncExitStack() as exits:
        yield recorder, await exits.enter_async_context(recorder.running())


async def _post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body, headers=headers | JSON) as r:
        return r.status, await r.read(), r.headers


async def test_a_clients_authorization_never_reaches_a_replica(
    recorded: tuple[Recorder, str], gateway: StartGateway, tmp_path: Path
) -> None:
    """With client keys, without them, and with the gateway's own replica key: the replica sees the
    gateway's credential or none, never the client's."""
    recorder, url = recorded
    open_gw = await gateway([url], health_interval=0.1)
    keyed = await gateway([url], health_interval=0.1, api_keys=_keys(tmp_path))
    own = await gateway([url], health_interval=0.1, replica_api_key="replica-secret")
    for gw, key in ((open_gw, "sk-anything"), (keyed, "sk-acme"), (own, "sk-client")):
        status, _, _ = await _post(gw.url, "/v1/chat/completions", CHAT, {"Authorization": f"Bearer {key}"})
        assert status == 200
    seen = [s.headers.get("Authorization") for s in recorder.client_requests()]
    assert seen == [None, None, "Bearer replica-secret"]
    polled = {s.headers.get("Authorization") for s in recorder.seen if s.path == "/health"}
    assert "Bearer replica-secret" in polled  # the gateway's own calls carry its credential too


async def test_a_cookie_one_answer_set_is_never_sent_with_another_request(
    recorded: tuple[Recorder, str], gateway: StartGateway
) -> None:
    """The gateway keeps no cookie jar: a replica's Set-Cookie goes back to the client it answered and
    is never replayed to a replica on anyone's later request (the gateway's own polling included)."""
    recorder, url = recorded
    recorder.set_cookie = "session=alice-secret; Path=/"
    gw = await gateway([url.replace("127.0.0.1", "localhost")], health_interval=0.1)  # a name, not an IP
    for _ in range(2):
        status, _, headers = await _post(gw.url, "/v1/chat/completions", CHAT, {})
        assert status == 200 and headers.get("Set-Cookie") == recorder.set_cookie
    assert [s.headers.get("Cookie") for s in recorder.seen] == [None] * len(recorder.seen)


async def test_credentials_in_a_replica_url_are_sent_never_shown(
    recorded: tuple[Recorder, str], gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    recorder, url = recorded
    secret_url = url.replace("http://", "http://ops:hunter2@")
    gw = await gateway([secret_url], health_interval=0.1, admin_key="adm", access_log=True)
    status, _, headers = await _post(gw.url, "/v1/chat/completions", CHAT, {})
    assert status == 200 and headers["x-kvroute-replica"] == url
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer adm"}) as s:
        shown = [await (await s.get(gw.url + p)).text() for p in ("/status", "/metrics", "/admin/replicas")]
    logged = [r.getMessage() for r in caplog.records]
    assert not any("hunter2" in text for text in [*shown, *logged, gw.gw.settings.redacted()["backends"][0]])
    assert url in shown[0] and url in shown[1]
    basic = "Basic " + base64.b64encode(b"ops:hunter2").decode()
    assert {s.headers.get("Authorization") for s in recorder.seen} == {basic}


async def test_status_and_metrics_need_a_key_once_one_is_set(
    recorded: tuple[Recorder, str], gateway: StartGateway
) -> None:
    _, url = recorded
    locked = await gateway([url], health_interval=0.1, admin_key="adm", status_key="peek")
    public = await gateway([url], health_interval=0.1, admin_key="adm", public_status=True)
    plain = await gateway([url], health_interval=0.1)
    cases = [
        (locked, {}, 401), (locked, {"Authorization": "Bearer nope"}, 401),
        (locked, {"Authorization": "Bearer adm"}, 200), (locked, {"Authorization": "Bearer peek"}, 200),
        (public, {}, 200), (plain, {}, 200),
    ]  # fmt: skip
    async with aiohttp.ClientSession() as s:
        for gw, headers, want in cases:
            for path in ("/status", "/metrics"):
                async with s.get(gw.url + path, headers=headers) as r:
                    assert r.status == want, (path, headers)
                    if want == 401:
                        assert (await r.json())["error"]["type"] == "authentication_error"
        async with s.get(locked.url + "/status", headers={"Accept": "text/html"}) as r:
            assert r.status == 200 and "keyform" in await r.text()  # the page holds no data
        async with s.post(
            locked.url + "/admin/control/flush_cache", headers={"Authorization": "Bearer peek"}
        ) as r:
            assert r.status == 401  # the status key reads; it is not the admin key


async def test_the_access_log_cannot_be_forged(
    recorded: tuple[Recorder, str], gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvroute.access")
    _, url = recorded
    gw = await gateway([url], health_interval=0.1, access_log=True)
    await raw_request(gw.url, "POST", "/v1/x%0aFORGED%20200", JSON, b"{}")
    await raw_request(gw.url, "POST", "/v1/chat/completions", JSON | {"x-request-id": 'a b"c'}, CHAT)
    lines = [r.getMessage() for r in caplog.records if r.name == "kvroute.access"]
    assert len(lines) == 2 and not any("\n" in line for line in lines)
    assert "/v1/x%0aFORGED%20200 400" in lines[0]
    assert lines[1].endswith(lines[1].split(" id=")[1]) and "id=a\\x20b\\x22c " in lines[1]


async def test_header_bytes_that_are_not_utf8_and_too_many_headers(
    recorded: tuple[Recorder, str], gateway: StartGateway
) -> None:
    recorder, url = recorded
    gw = await gateway([url], health_interval=0.1)
    status, body = await raw_request(
        gw.url, "POST", "/v1/chat/completions", JSON, CHAT, b"X-Foo: \xff\xfe\r\n"
    )
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_header"
    many = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 8000) for i in range(100))
    status, body = await raw_request(gw.url, "POST", "/v1/chat/completions", JSON, CHAT, many)
    assert status == 431 and orjson.loads(body)["error"]["code"] == "headers_too_large"
    assert recorder.client_requests() == []


async def test_a_client_that_stops_reading_a_stream_frees_its_replica(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    """A reader with a tiny receive window that reads nothing: once one write waits past the write
    timeout, the gateway drops it and aborts the request on the replica, long before its natural end."""
    emu = await emulator_server(*EMU_FLAGS)
    gw = await gateway([emu.url], health_interval=0.1, client_write_timeout=0.3)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True}
    raw = orjson.dumps(body | {"max_tokens": 60000, "ignore_eos": True})
    host, port = gw.url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, int(port)))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    await loop.sock_sendall(sock, head.encode() + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    try:
        await wait_for(lambda: emu.replica.metrics.live.aborted_total == 1, timeout_s=30)
        assert emu.replica.engine.running == 0
        assert 'kvroute_client_disconnects_total{route="chat"} 1.0' in gw.metrics()
    finally:
        sock.close()


async def test_the_passthrough_is_limited_like_the_typed_routes(
    recorded: tuple[Recorder, str], gateway: StartGateway
) -> None:
    recorder, url = recorded
    gw = await gateway([url], health_interval=0.1, max_json_depth=8)
    deep: Any = "x"
    for _ in range(20):
        deep = [deep]
    status, body, _ = await _post(gw.url, "/v1/tokenize", orjson.dumps({"prompt": deep}), {})
    assert status == 400 and orjson.loads(body)["error"]["code"] == "too_deep"
    status, body, _ = await _post(gw.url, "/v1/tokenize", b"not json", {})
    assert status == 400
    status, _, _ = await _post(gw.url, "/v1/tokenize?a=1", orjson.dumps({"prompt": "hi"}), {})
    assert status == 200
    assert [s.target for s in recorder.client_requests()] == ["/v1/tokenize?a=1"]
