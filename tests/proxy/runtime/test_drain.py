"""Graceful drain of a real ``kvroute serve`` process: SIGTERM turns /ready to 503 first, refuses new
generation requests with 503 + Retry-After, lets a stream in flight finish, then exits 0; a second
SIGTERM stops it at once. The replica is an in-process emulator whose streams last about a second."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import orjson

from tests.conftest import MODEL, Emulators
from tests.proxy.gateway_proc import GatewayProcess, gateway_process

# --emu-time-scale 0.1: decode at 400 tokens/s, so a 500-token stream lasts ~1.3 s
EMU = ("--served-model-name", MODEL, "--emu-time-scale", "0.1", "--page-size", "16")
LONG = {"model": MODEL, "prompt": "tell a long story", "max_tokens": 500, "stream": True}
SHORT = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
TIMEOUT = aiohttp.ClientTimeout(total=30)


async def _stream(s: aiohttp.ClientSession, url: str, started: asyncio.Event, tokens: int) -> bytes:
    body = b""
    try:
        async with s.post(url + "/v1/completions", json=LONG | {"max_tokens": tokens}) as r:
            assert r.status == 200
            async for chunk in r.content.iter_any():
                body += chunk
                started.set()
    except aiohttp.ClientPayloadError:
        pass  # cut: the caller looks at what arrived
    return body


async def _start(s: aiohttp.ClientSession, gw: GatewayProcess, tokens: int = 500) -> asyncio.Task[bytes]:
    started = asyncio.Event()
    task = asyncio.create_task(_stream(s, gw.url, started, tokens))
    await asyncio.wait_for(started.wait(), 10)
    return task


async def test_sigterm_drains_then_exits_0(emulator_server: Emulators, tmp_path: Path) -> None:
    emu = await emulator_server(*EMU)
    flags = ("--backend", emu.url, "--drain-timeout", "20", "--health-interval", "0.2")
    async with (
        gateway_process(tmp_path / "gw.log", *flags) as gw,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        async with s.get(gw.url + "/ready") as r:
            assert r.status == 200
        task = await _start(s, gw)
        gw.signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        async with s.get(gw.url + "/ready") as r:
            assert r.status == 503 and (await r.json())["status"] == "draining"
        async with s.post(gw.url + "/v1/completions", json=SHORT) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["code"] == "draining"
        assert not task.done()  # the stream is still running while the process drains
        body = await task
        assert body.rstrip().endswith(b"data: [DONE]")
        events = [orjson.loads(e[6:]) for e in body.split(b"\n\n") if e.startswith(b"data: {")]
        assert sum(len(e["choices"][0]["text"]) > 0 for e in events if e["choices"]) > 100
        assert await gw.exit_status(10) == 0


async def test_a_second_sigterm_stops_at_once(emulator_server: Emulators, tmp_path: Path) -> None:
    emu = await emulator_server(*EMU)
    flags = ("--backend", emu.url, "--drain-timeout", "120", "--health-interval", "0.2")
    async with (
        gateway_process(tmp_path / "gw.log", *flags) as gw,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        task = await _start(s, gw, tokens=20_000)  # ~50 s
        gw.signal(signal.SIGTERM)
        await asyncio.sleep(0.1)
        gw.signal(signal.SIGTERM)
        assert await gw.exit_status(10) == 1  # well before the 120 s drain timeout and the stream's end
        body = await task
        assert b"[DONE]" not in body
        assert "second signal" in gw.log.read_text()


async def test_the_drain_is_bounded_by_its_timeout(emulator_server: Emulators, tmp_path: Path) -> None:
    emu = await emulator_server(*EMU)
    flags = ("--backend", emu.url, "--drain-timeout", "0.5", "--health-interval", "0.2")
    async with (
        gateway_process(tmp_path / "gw.log", *flags) as gw,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        task = await _start(s, gw, tokens=20_000)  # ~50 s
        gw.signal(signal.SIGTERM)
        assert await gw.exit_status(10) == 0
        assert b"[DONE]" not in await task
        assert "drain timeout: stopping with 1 requests in progress" in gw.log.read_text()
