"""Faults on demand (--emu-enable-faults), client disconnects and /abort_request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.emulator.conftest import Emu, StartEmu

FAULTS = ("--emu-enable-faults", "--emu-time-scale", "0.01")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 8}


async def _arm(http: aiohttp.ClientSession, emu: Emu, **body: object) -> dict[str, object]:
    async with http.post(f"{emu.url}/_emu/faults", json=body) as resp:
        assert resp.status == 200
        result: dict[str, object] = await resp.json()
        return result


async def test_faults_endpoint_only_when_enabled(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator("--emu-time-scale", "0.01")
    async with http.post(f"{emu.url}/_emu/faults", json={"action": "clear"}) as resp:
        assert resp.status == 404


async def test_fail_then_recover(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAULTS)
    listed = await _arm(http, emu, action="fail", status=503, count=2)
    assert listed["faults"] == [{"action": "fail", "status": 503, "after_chunks": 1, "count": 2}]
    for _ in range(2):
        async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 503
            err = await resp.json()
            assert err["object"] == "error" and err["code"] == 503
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    async with http.post(f"{emu.url}/_emu/faults", json={"action": "explode"}) as resp:
        assert resp.status == 400


async def test_hang_until_client_leaves(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAULTS)
    await _arm(http, emu, action="hang", count=1)
    with pytest.raises(asyncio.TimeoutError):
        timeout = aiohttp.ClientTimeout(total=0.3)
        async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT, timeout=timeout) as resp:
            await resp.read()
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200  # the hang was used up


async def test_cut_stream(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAULTS)
    await _arm(http, emu, action="cut_stream", after_chunks=2, count=1)
    chunks = 0
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(f"{emu.url}/v1/chat/completions", json=dict(CHAT, stream=True)) as resp:
            async for raw in resp.content:
                chunks += raw.startswith(b"data: ")
    assert chunks == 2
    await _until(lambda: not emu.replica.engine.busy())


async def _until(predicate: object, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def _e2e(http: aiohttp.ClientSession, emu: Emu) -> float:
    start = time.perf_counter()
    async with http.post(f"{emu.url}/v1/chat/completions", json=dict(CHAT, max_tokens=12)) as resp:
        await resp.read()
    return time.perf_counter() - start


async def test_slow_multiplies_modelled_time(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator("--emu-enable-faults", "--emu-time-scale", "0.1")
    normal = await _e2e(http, emu)
    await _arm(http, emu, action="slow", factor=4)
    slow = await _e2e(http, emu)
    assert 2.5 < slow / normal < 6
    listed = await _arm(http, emu, action="clear")
    assert listed == {"faults": [], "slow_factor": 1.0, "unhealthy": None, "down_until": None}


async def test_restart_keeps_storage_only(
    emulator: StartEmu, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    emu = await emulator(
        *FAULTS,
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--emu-storage-dir",
        str(tmp_path),
    )
    body = orjson.dumps({"input_ids": list(range(1000, 1600)), "sampling_params": {"max_new_tokens": 1}})
    async with http.post(f"{emu.url}/generate", data=body) as resp:
        assert (await resp.json())["meta_info"]["cached_tokens"] == 0
    async with http.get(f"{emu.url}/server_info") as resp:
        before = (await resp.json())["startup_time"]
    await _arm(http, emu, action="restart")
    async with http.get(f"{emu.url}/health") as resp:
        assert resp.status == 503
    async with http.get(f"{emu.url}/server_info") as resp:
        assert (await resp.json())["startup_time"] != before
    assert emu.replica.engine.cache.stats().gpu_cached == 0
    await _until(emu.replica.healthy)
    async with http.post(f"{emu.url}/generate", data=body) as resp:
        meta = (await resp.json())["meta_info"]
    details = meta["cached_tokens_details"]
    assert details["device"] == 0 and details["host"] == 0 and details["storage"] >= 256


async def _generate(http: aiohttp.ClientSession, emu: Emu, body: bytes) -> int:
    """Its cached tokens; a reset connection raises aiohttp.ClientConnectionError."""
    async with http.post(f"{emu.url}/generate", data=body) as resp:
        assert resp.status == 200
        return int((await resp.json())["meta_info"]["cached_tokens"])


async def test_restart_with_down_time_is_a_killed_process_then_an_empty_one(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAULTS, "--emu-debug")  # time scale 0.01: 40 modelled s = 0.4 s
    body = orjson.dumps({"input_ids": list(range(1000, 1600)), "sampling_params": {"max_new_tokens": 1}})
    assert await _generate(http, emu, body) == 0
    assert await _generate(http, emu, body) >= 512  # cached before the restart
    start = time.monotonic()
    listed = await _arm(http, emu, action="restart", down_s=40)
    assert listed["down_until"] is not None
    with pytest.raises(aiohttp.ClientConnectionError):  # no status line: the connection is reset
        await _generate(http, emu, body)
    assert [await _probe(http, emu, p) for p in ("/health", "/ready", "/health_generate")] == [503] * 3
    assert time.monotonic() - start < 0.4, "the checks above must run inside the down time"
    while await _probe(http, emu) != 200:
        assert time.monotonic() - start < 5.0, "still down"
        await asyncio.sleep(0.02)
    assert time.monotonic() - start >= 0.4 * 0.95
    assert await _generate(http, emu, body) == 0  # back with an empty cache
    assert (await _arm(http, emu, action="clear"))["down_until"] is None
    log = await emu.requests("/generate")
    assert [e["outcome"] for e in log] == ["answered", "answered", "reset", "answered"]


async def test_restart_down_time_ends_on_clear_and_must_not_be_negative(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAULTS)
    await _arm(http, emu, action="restart", down_s=10_000)
    assert await _probe(http, emu, "/ready") == 503
    await _arm(http, emu, action="clear")
    await _until(emu.replica.healthy)
    assert await _probe(http, emu, "/ready") == 200
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
    async with http.post(f"{emu.url}/_emu/faults", json={"action": "restart", "down_s": -1}) as resp:
        assert resp.status == 400


async def test_disconnect_aborts_in_engine(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator("--emu-time-scale", "0.05", "--enable-metrics", "--emu-debug")
    body = dict(CHAT, max_tokens=400, stream=True)
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        await resp.content.readline()
        resp.close()
    await _until(lambda: emu.replica.metrics.live.aborted_total == 1 and not emu.replica.engine.busy())
    assert emu.replica.engine.cache.stats().gpu_used == emu.replica.engine.cache.stats().gpu_cached
    async with http.get(f"{emu.url}/metrics") as resp:
        assert "sglang:num_aborted_requests_total" in await resp.text()
    assert [e["outcome"] for e in await emu.requests("/v1/chat/completions")] == ["cancelled"]


async def test_abort_request_by_rid(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator("--emu-time-scale", "0.05", "--enable-metrics", "--emu-debug")
    body = dict(CHAT, max_tokens=400, stream=True, rid="rid-to-abort")
    events = []
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        async for raw in resp.content:
            if raw.startswith(b"data: "):
                events.append(raw[6:].strip())
                if len(events) == 2:
                    async with http.post(f"{emu.url}/abort_request", json={"rid": "rid-to-abort"}) as abort:
                        assert abort.status == 200
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["error"]["message"] == "Abort request by user."
    assert not emu.replica.engine.busy()
    async with http.post(f"{emu.url}/abort_request", json={"rid": "no-such-rid"}) as abort:
        assert abort.status == 200
    state = await emu.state()
    assert state["abort_requests"] == {"total": 2, "rids": ["rid-to-abort", "no-such-rid"]}
    assert state["aborted_total"] == 1  # counted once, like a dropped connection; the unknown rid is not
    async with http.get(f"{emu.url}/metrics") as resp:
        assert 'sglang:num_aborted_requests_total{model_name="' in (text := await resp.text())
    assert any(
        line.startswith("sglang:num_aborted_requests_total{") and line.endswith(" 1.0")
        for line in text.splitlines()
    )


async def test_reset_closes_the_connection_before_any_byte(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAULTS, "--emu-debug")
    listed = await _arm(http, emu, action="reset", count=1)
    assert listed["faults"] == [{"action": "reset", "status": 503, "after_chunks": 1, "count": 1}]
    with pytest.raises(aiohttp.ClientConnectionError):  # no status line: a reset, not an HTTP error
        async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
            await resp.read()
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200  # the reset was used up
    log = await emu.requests("/v1/chat/completions")
    assert [(e["outcome"], e["status"]) for e in log] == [("reset", None), ("answered", 200)]
    assert (await emu.state())["requests_total"] == 1  # the reset request never reached the engine


async def _probe(http: aiohttp.ClientSession, emu: Emu, path: str = "/health") -> int:
    async with http.get(emu.url + path) as resp:
        return resp.status


async def test_unhealthy_for_n_probes(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAULTS)
    listed = await _arm(http, emu, action="unhealthy", count=3)
    assert listed["unhealthy"] == {"probes": 3, "until": None}
    statuses = [await _probe(http, emu, p) for p in ("/health", "/ready", "/health_generate", "/health")]
    assert statuses == [503, 503, 503, 200]
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200  # only the probes fail


async def test_unhealthy_for_modelled_seconds_and_until_cleared(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAULTS)  # time scale 0.01: 20 modelled s = 0.2 s
    await _arm(http, emu, action="unhealthy", seconds=20)
    assert await _probe(http, emu) == 503
    deadline = time.monotonic() + 5.0
    while await _probe(http, emu) != 200:
        assert time.monotonic() < deadline, "still unhealthy"
        await asyncio.sleep(0.02)
    await _arm(http, emu, action="unhealthy")
    assert [await _probe(http, emu) for _ in range(3)] == [503, 503, 503]
    assert (await _arm(http, emu, action="clear"))["unhealthy"] is None
    assert await _probe(http, emu) == 200
    for bad in ({"count": 0}, {"seconds": -1}, {"count": "x"}):
        async with http.post(f"{emu.url}/_emu/faults", json={"action": "unhealthy", **bad}) as resp:
            assert resp.status == 400
