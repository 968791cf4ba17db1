"""The request log (--emu-debug, GET /_emu/requests): what arrived, hashed, never the prompt text."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import orjson

from emulator.request_log import AbortLog, RequestLog
from tests.emulator.conftest import StartEmu

BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "secret prompt"}], "max_tokens": 2}
)


async def test_log_records_path_headers_and_body_hash(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator("--emu-time-scale", "0.01", "--emu-debug")
    headers = {"Content-Type": "application/json", "x-request-id": "rq-1", "Authorization": "Bearer sk-1"}
    async with http.post(f"{emu.url}/v1/chat/completions?a=1", data=BODY, headers=headers) as resp:
        assert resp.status == 200
    for probe in ("/health", "/get_server_info", "/get_model_info", "/get_load", "/_emu/state"):
        async with http.get(emu.url + probe) as resp:
            assert resp.status == 200
    async with http.get(f"{emu.url}/no/such/route") as resp:
        assert resp.status == 404
    async with http.get(f"{emu.url}/_emu/requests") as resp:
        raw = await resp.read()
    doc = orjson.loads(raw)
    assert doc["total"] == 2 and [e["path"] for e in doc["requests"]] == [
        "/v1/chat/completions",
        "/no/such/route",
    ]
    chat = doc["requests"][0]
    assert (chat["method"], chat["query"], chat["outcome"], chat["status"]) == (
        "POST",
        "a=1",
        "answered",
        200,
    )
    assert chat["body_sha256"] == hashlib.sha256(BODY).hexdigest() and chat["body_bytes"] == len(BODY)
    assert chat["headers"]["x-request-id"] == "rq-1" and chat["headers"]["authorization"] == "***"
    assert doc["requests"][1]["status"] == 404
    assert b"secret prompt" not in raw and b"sk-1" not in raw
    async with http.get(f"{emu.url}/_emu/requests?path=/no/such/route") as resp:
        assert [e["seq"] for e in (await resp.json())["requests"]] == [2]


async def test_log_only_with_debug(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator("--emu-time-scale", "0.01")
    async with http.post(
        f"{emu.url}/v1/chat/completions", data=BODY, headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 200
    async with http.get(f"{emu.url}/_emu/requests") as resp:
        assert resp.status == 404
    assert emu.replica.requests.total == 0


def test_log_is_bounded() -> None:
    log, aborts = RequestLog(size=3), AbortLog(size=2)
    for i in range(5):
        log.record("POST", f"/p{i}", "", {"Cookie": "c"}, b"x" * i)
        aborts.record(f"r{i}")
    doc: Any = log.to_json()
    assert doc["total"] == 5 and [e["path"] for e in doc["requests"]] == ["/p2", "/p3", "/p4"]
    assert doc["requests"][0]["headers"] == {"cookie": "***"}
    assert aborts.to_json() == {"total": 5, "rids": ["r3", "r4"]}
