"""The timing model (pure numbers) and the scheduler: queueing, chunked prefill, time scale, and reuse of
a running request's prompt (inserted after each prefill chunk, before the request finishes)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench.systems.fleet import EmulatorFleet
from emulator.config import parse_args
from emulator.timing import PROFILES, ProfileTiming, ttft_seconds
from tests.emulator.conftest import Emu, StartEmu


def test_rtx3090_profile_reproduces_seed_1() -> None:
    t = ProfileTiming(PROFILES["rtx3090x2"])
    n = 40_000
    assert ttft_seconds(t, n, 0, 0, 0) == pytest.approx(15.4, rel=0.01)
    assert ttft_seconds(t, n, n - 1, n - 1, 0) == pytest.approx(0.4, rel=0.02)
    assert ttft_seconds(t, n, n - 1, 0, 0) == pytest.approx(0.1, rel=0.01)
    assert 1 / t.decode_token_seconds(1) == pytest.approx(137)
    assert 1 / ProfileTiming(PROFILES["rtx3090x2"], hicache=True).decode_token_seconds(1) == pytest.approx(
        133
    )
    assert t.decode_token_seconds(4) == pytest.approx(1.24 / 137)


def test_rx7900_profile_reproduces_seed_2() -> None:
    t = ProfileTiming(PROFILES["rx7900xtx2"])
    n = 128_000
    assert ttft_seconds(t, n, 0, 0, 0) == pytest.approx(192, rel=0.01)
    assert ttft_seconds(t, n, n - 1, n - 1, 0) == pytest.approx(2.65, rel=0.02)


def test_prefill_cost_is_superlinear_and_chunking_invariant() -> None:
    t = ProfileTiming(PROFILES["rtx3090x2"])
    whole = t.prefill_seconds(0, 10_000)
    chunks = sum(t.prefill_seconds(s, min(s + 2048, 10_000)) for s in range(0, 10_000, 2048))
    assert chunks == pytest.approx(whole)
    assert t.prefill_seconds(30_000, 32_000) > t.prefill_seconds(0, 2_000)
    assert t.load_seconds(20_000, 20_000) == pytest.approx(20_000 / 133_333 + 1.0)


def _body(ids: list[int], max_new: int) -> bytes:
    return orjson.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": max_new}, "stream": True})


async def _stream(http: aiohttp.ClientSession, emu: Emu, body: bytes, log: list[str], name: str) -> float:
    """Send a streamed /generate; log "<name>:first" and "<name>:done"; return wall TTFT."""
    start, ttft = time.perf_counter(), 0.0
    async with http.post(f"{emu.url}/generate", data=body) as resp:
        async for raw in resp.content:
            if raw.startswith(b"data: {") and f"{name}:first" not in log:
                ttft = time.perf_counter() - start
                log.append(f"{name}:first")
    log.append(f"{name}:done")
    return ttft


async def _until(predicate: object, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def test_second_request_waits_with_one_running_slot(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator("--max-running-requests", "1", "--emu-time-scale", "0.05", "--enable-metrics")
    log: list[str] = []
    a = asyncio.create_task(_stream(http, emu, _body(list(range(1, 200)), 200), log, "a"))
    await _until(lambda: "a:first" in log)
    b = asyncio.create_task(_stream(http, emu, _body(list(range(500, 700)), 2), log, "b"))
    await _until(lambda: len(emu.replica.engine.waiting) == 1)
    async with http.get(f"{emu.url}/get_load") as resp:
        assert (await resp.json())[0]["num_waiting_reqs"] == 1
    async with http.post(f"{emu.url}/flush_cache") as resp:
        assert resp.status == 400  # busy: SGLang flushes only when idle
    await asyncio.gather(a, b)
    assert log.index("a:done") < log.index("b:first")
    async with http.get(f"{emu.url}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("sglang:queue_time_seconds_sum"))
    assert float(line.split()[-1]) > 0.05  # b waited for a's decode (modelled seconds)


def _record_steps(emu: Emu) -> list[list[tuple[int, int, int]]]:
    """Every step the engine forms from now on, as (prompt length, start, end) per request."""
    engine, steps = emu.replica.engine, list[list[tuple[int, int, int]]]()
    form = engine._form_step

    def recording() -> Any:
        step = form()
        if step:
            steps.append([(len(t.work.prompt), s, e) for t, s, e in step])
        return step

    engine._form_step = recording  # type: ignore[method-assign]
    return steps


async def test_chunked_prefill_budget_is_shared_by_the_step(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """SGLang's chunk size caps a whole prefill batch (PrefillAdder.rem_chunk_tokens): a short request
    sent while a long one is mid-prefill does not jump in between its chunks; it joins the step of the
    long one's last chunk, whose leftover budget covers it, and both get their first token then."""
    emu = await emulator("--chunked-prefill-size", "2048", "--emu-time-scale", "0.05", "--emu-debug")
    steps = _record_steps(emu)
    log: list[str] = []
    long = asyncio.create_task(_stream(http, emu, _body(list(range(1, 10_001)), 1), log, "long"))
    await _until(lambda: bool(emu.replica.engine.prefilling))
    peek = {"path": "/generate", "body": {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 1}}}
    async with http.post(f"{emu.url}/_emu/predict", json=peek) as resp:
        predicted = await resp.json()
    timing = ProfileTiming(PROFILES["rtx3090x2"])
    assert 0 < predicted["queue_s"] <= ttft_seconds(timing, 10_000, 0, 0, 0)
    short_ttft, long_ttft = await asyncio.gather(
        _stream(http, emu, _body(list(range(20_000, 20_050)), 1), log, "short"), long
    )
    assert all(sum(e - s for _n, s, e in step) <= 2048 for step in steps)
    assert [(n, s, e) for n, s, e in steps[-1]] == [(10_000, 8192, 10_000), (50, 0, 50)]
    assert all(n == 10_000 for step in steps[:-1] for n, _s, _e in step)
    assert short_ttft == pytest.approx(long_ttft, abs=0.1)  # same step, one overhead


async def test_a_new_request_starts_its_chunks_in_the_leftover_budget(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """Two cold prompts of 5,000 tokens with a 2,048 chunk and 16-token pages: the second one starts as
    the next chunked request with what the first one's last chunk leaves (page-floored), so no step
    ever computes more than the chunk size."""
    emu = await emulator("--chunked-prefill-size", "2048", "--page-size", "16", "--emu-time-scale", "0.05")
    steps = _record_steps(emu)
    a, b = list(range(1, 5_001)), list(range(10_001, 15_001))
    first = asyncio.create_task(_stream(http, emu, _body(a, 1), [], "a"))
    await _until(lambda: bool(emu.replica.engine.prefilling))
    await asyncio.gather(first, _stream(http, emu, _body(b, 1), [], "b"))
    assert steps == [
        [(5_000, 0, 2048)],
        [(5_000, 2048, 4096)],
        [(5_000, 4096, 5_000), (5_000, 0, 1136)],  # 1,144 left, floored to 71 pages
        [(5_000, 1136, 3184)],
        [(5_000, 3184, 5_000)],
    ]


async def test_without_chunking_a_request_never_splits(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """--chunked-prefill-size -1: a prompt is computed in one step; a request that does not fit what
    max_prefill_tokens leaves of a step waits for the next one."""
    emu = await emulator(
        "--chunked-prefill-size", "-1", "--max-prefill-tokens", "8000", "--emu-time-scale", "0.02"
    )
    steps = _record_steps(emu)
    a, b = list(range(1, 6_001)), list(range(10_001, 13_001))
    first = asyncio.create_task(_stream(http, emu, _body(a, 1), [], "a"))
    await _until(lambda: bool(emu.replica.engine.prefilling))
    await asyncio.gather(first, _stream(http, emu, _body(b, 1), [], "b"))
    assert steps == [[(6_000, 0, 6_000)], [(3_000, 0, 3_000)]]


async def _generate(http: aiohttp.ClientSession, emu: Emu, body: bytes, log: list[str], name: str) -> Any:
    """Send a streamed /generate; log "<name>:first" and "<name>:done"; return the last meta_info."""
    meta: Any = None
    async with http.post(f"{emu.url}/generate", data=body) as resp:
        async for raw in resp.content:
            if raw.startswith(b"data: {"):
                meta = orjson.loads(raw[6:])["meta_info"]
                if f"{name}:first" not in log:
                    log.append(f"{name}:first")
    log.append(f"{name}:done")
    return meta


DOC = [(j * 7_919) % 150_000 for j in range(40_000)]


async def test_a_decoding_request_prompt_hits_before_it_finishes(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """SGLang inserts a prompt into the radix tree once its prefill is done (cache_unfinished_req): a
    second request with the same 40K prompt, sent after the first one's first token but before it ends,
    reuses the whole prompt from GPU."""
    emu = await emulator("--emu-time-scale", "0.03")
    log: list[str] = []
    a = asyncio.create_task(_generate(http, emu, _body(DOC, 2_000), log, "a"))  # 15 s decode: 0.44 s wall
    await _until(lambda: "a:first" in log)
    b = await _generate(http, emu, _body(DOC, 2), log, "b")
    assert "a:done" not in log  # b was served while a was still decoding
    assert b["cached_tokens"] == len(DOC) - 1  # the whole prompt but its last token (always computed)
    assert b["cached_tokens_details"] == {"device": len(DOC) - 1, "host": 0}
    assert (await a)["cached_tokens"] == 0


async def test_a_prefilling_request_chunks_hit_before_its_prefill_ends(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """With chunked prefill each chunk is inserted once computed (chunked=True). A second request with the
    same prompt, sent while the first one is mid-prefill, waits (one chunked request at a time), joins
    the step of the first one's last chunk and reuses, on GPU, the 19 chunks inserted before it."""
    emu = await emulator("--chunked-prefill-size", "2048", "--emu-time-scale", "0.05")
    engine, log = emu.replica.engine, list[str]()
    a = asyncio.create_task(_generate(http, emu, _body(DOC, 2), log, "a"))
    await _until(lambda: any(t.pos >= 8 * 2048 for t in engine.prefilling))
    b = await _generate(http, emu, _body(DOC, 2), log, "b")
    assert b["cached_tokens"] == 19 * 2048  # the first 40,000 // 2048 chunks; a's last one was running
    assert b["cached_tokens_details"] == {"device": 19 * 2048, "host": 0}
    assert (await a)["cached_tokens"] == 0


async def test_time_scale_stretches_modelled_durations(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    walls = []
    for scale in ("0.005", "0.02"):
        emu = await emulator("--emu-time-scale", scale)
        walls.append(await _stream(http, emu, _body(list(range(1, 8_001)), 1), [], "x"))
    modelled = ttft_seconds(ProfileTiming(PROFILES["rtx3090x2"]), 8_000, 0, 0, 0)
    assert walls[1] == pytest.approx(modelled * 0.02, rel=0.25)
    assert 2.5 < walls[1] / walls[0] < 5.0


def test_config_takes_sglang_flags_and_ignores_unknown_ones() -> None:
    argv = ["--port", "31000", "--replicas", "3", "--enable-hierarchical-cache", "--hicache-ratio", "2"]
    argv += ["--cuda-graph-max-bs", "8", "--enable-torch-compile", "--attention-backend=fa3", "--tp", "2"]
    cfg = parse_args(argv)
    assert cfg.ports == (31000, 31001, 31002) and cfg.tp_size == 2
    assert cfg.ignored_flags == ("--cuda-graph-max-bs", "--enable-torch-compile", "--attention-backend")
    assert cfg.gpu_tokens == 159_746  # 233,207 minus HiCache's ~31.5% (the seeds: 159,692)
    assert cfg.host_tokens == 2 * 159_746 + 1
    assert cfg.served_model_name == "kvroute-emu" and Path(cfg.model_path, "tokenizer.json").is_file()
    assert cfg.tool_call_parser == "qwen25"  # on by default, unlike SGLang
    assert parse_args(["--tool-call-parser", "none"]).tool_call_parser is None
    assert parse_args(["--served-model-name", "qwen"]).served_model_name == "qwen"
    capped = parse_args(["--ports", "1,2", "--max-total-tokens", "1000", "--page-size", "64"])
    assert capped.ports == (1, 2) and capped.gpu_tokens == 960
    with pytest.raises(SystemExit):
        parse_args(["--emu-unknown", "1"])


def test_cli_serves_n_replicas_with_one_ready_line_each() -> None:
    with EmulatorFleet(2, ["--emu-time-scale", "0.001", "--some-sglang-flag", "x"]) as fleet:
        for url in fleet.urls:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
                assert json.load(resp)["data"][0]["owned_by"] == "sglang"
        warnings = [line for line in fleet.log_text().splitlines() if "--some-sglang-flag" in line]
    assert len(warnings) == 1


async def test_the_tokens_a_waiting_request_lost_to_evictions_are_counted(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    """`arrival_lost_tokens_total` (/_emu/state): a request that found its prefix cached on arrival
    and lost it to an eviction while it waited counts that prefix; one that kept it, or found more
    cached at admission than on arrival (a request ahead of it inserted its prompt), counts nothing."""
    flags = ("--max-running-requests", "1", "--max-total-tokens", "3000", "--emu-time-scale", "0.05")
    emu = await emulator(*flags, "--page-size", "1", "--emu-debug")
    prefix = list(range(1, 1001))
    log: list[str] = []
    await _stream(http, emu, _body(prefix, 1), log, "p")  # cached, unlocked once finished
    await _stream(http, emu, _body([*prefix, 7], 1), log, "hit")  # kept it: nothing lost
    running = asyncio.create_task(_stream(http, emu, _body(list(range(5000, 5500)), 40), log, "x"))
    await _until(lambda: "x:first" in log)
    long = asyncio.create_task(_stream(http, emu, _body(list(range(6000, 8000)), 1), log, "long"))
    await _until(lambda: len(emu.replica.engine.waiting) == 1)
    lost = asyncio.create_task(_stream(http, emu, _body([*prefix, 9], 1), log, "lost"))
    await asyncio.gather(running, long, lost)
    async with http.get(f"{emu.url}/_emu/state") as resp:
        state = await resp.json()
    assert state["arrival_lost_tokens_total"] == len(prefix)  # "long" evicted it before "lost" ran
