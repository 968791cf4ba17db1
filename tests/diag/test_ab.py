"""`kvroute ab` against real emulated replicas, and the busy-server /flush_cache retry it relies on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from diag.ab import Phase, main
from diag.client import DiagError, Generation, SGLangClient
from diag.prompts import PromptMaker
from tests.conftest import Emulators
from tests.diag.cli import run_main

SCALE = ("--emu-time-scale", "0.05")
WRITE_BACK = ("--enable-hierarchical-cache", "--hicache-write-policy", "write_back", "--page-size", "1")
TOKENS = 20_000


async def run_cli(*argv: str) -> tuple[int, str, str]:
    return await run_main(main, *argv)


async def test_ab_on_a_write_back_replica(emulator_server: Emulators) -> None:
    emu = await emulator_server(*WRITE_BACK, *SCALE)
    argv = ("--context-tokens", str(TOKENS), "--max-new-tokens", "16", "--json", "--seed", "4")
    code, out, err = await run_cli(emu.url, *argv)
    assert code == 0, err
    (result,) = orjson.loads(out)["results"]
    cold, hot = result["phases"]["cold"], result["phases"]["hot"]
    assert len(cold["ttfts"]) == len(hot["ttfts"]) == 3 and result["notes"] == []  # every cold run was cold
    assert max(cold["ttfts"]) < 1.2 * min(cold["ttfts"])
    assert cold["last"]["cached_tokens"] == 0
    assert hot["last"]["device"] == TOKENS - 1 and hot["last"]["host"] == 0
    assert cold["median"] == sorted(cold["ttfts"])[1]
    assert cold["prefill_rate"] == pytest.approx(TOKENS / cold["median"])
    assert result["speedup"] > 10
    last = hot["last"]  # TTFT is the first token: 15 decode steps (15 / 133 tok/s, x 0.05) come after it
    assert last["total_s"] - last["ttft_s"] > 0.8 * 15 / 133 * 0.05
    for i in (1, 2, 3):
        assert f"run {i}/3: cache flushed" in err and f"run {i}/3 cold" in err and f"run {i}/3 hot" in err


async def test_ab_compares_hicache_on_and_off_side_by_side(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    on = await emulator_server(*WRITE_BACK, *SCALE)
    off = await emulator_server("--page-size", "1", *SCALE)
    argv = ("--context-tokens", str(TOKENS), "--runs", "1", "--quiet", "--plot", str(tmp_path / "ab.png"))
    code, out, _ = await run_cli(on.url, off.url, *argv)
    assert code == 0 and (tmp_path / "ab.png").read_bytes().startswith(b"\x89PNG")
    lines = out.splitlines()
    assert lines[0].startswith("kvroute ab: 20,000-token prompt, median of 1 runs")
    on_at = next(i for i, line in enumerate(lines) if on.url in line and "HiCache write_back" in line)
    off_at = next(i for i, line in enumerate(lines) if off.url in line and "HiCache off" in line)
    cold = [float(lines[i + 2].split()[1]) for i in (on_at, off_at)]
    assert lines[on_at + 2].split()[0] == "cold" and lines[on_at + 3].split()[0] == "hot"
    assert abs(cold[0] / cold[1] - 1) < 0.2  # seed 2: HiCache does not make a cold prefill faster


async def test_flush_waits_while_the_server_is_busy(emulator_server: Emulators) -> None:
    emu = await emulator_server(*WRITE_BACK, "--emu-time-scale", "0.1")
    async with SGLangClient(emu.url) as client:
        prompt = (await PromptMaker.create(client, 1, 1)).make(40_000)  # 1.5 s of prefill at this scale
        running = asyncio.create_task(client.generate(prompt.body))
        await asyncio.sleep(0.3)
        status, _ = await client.request("POST", "/flush_cache")
        assert status == 400  # SGLang refuses to flush while a request runs
        with pytest.raises(DiagError, match="flush_cache returned HTTP 400"):
            await client.flush_cache(0.2)
        started = time.monotonic()
        await client.flush_cache(10.0)
        assert running.done() and time.monotonic() - started > 0.5
        assert (await running).cached_tokens == 0
        assert emu.replica.engine.cache.stats().gpu_used == 0


def test_phase_median_and_prefill_rate() -> None:
    g = Generation(2.0, 2.1, 1000, 0, 0, 0, None, None)
    phase = Phase("cold", (3.0, 1.0, 2.0), 1000, g)
    assert phase.median == 2.0 and phase.prefill_rate == 500.0  # prompt tokens / median TTFT
