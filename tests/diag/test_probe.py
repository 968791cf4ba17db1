"""`kvroute probe` against real emulated replicas (in-process, port 0) in each HiCache mode.

The replicas have a 48,000-token GPU pool (page 1) and, with HiCache, a 96,001-token host pool, so the
probe plans 2 pressure contexts of 26,000 tokens (between the GPU pool and host pool - R). Timings:

- write_back (slow-marked, time scale 0.4, ~15 s): the probe's wall TTFTs, converted to modelled
  seconds, must be within 20% of seed 1's ratios cold : after eviction : again = 15.4 : 0.4 : 0.1.
  Conversion: modelled = (wall - floor) / scale, where the floor is the real time a 40K-token request
  spends outside the emulator's timeline (loopback HTTP, JSON parsing, the radix match; ~4 ms here),
  measured after the probe on the same replica as the least wall - modelled x scale over 8 more GPU hits
  of R (modelled from their cached-token report with the emulator's timing model; noise only adds time,
  so the least is the floor). At scale 0.4 the 0.1 s step is 40 ms, and the probe reports the fastest
  of its 3 sends of step 4, so a few ms of scheduling noise stay inside the margin.
- the verdict tests run at scale 0.05 (~2 s each) through the command line (`main`, in a thread) and
  check the verdict, the per-tier cached tokens and the host-pool gauge.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from diag.client import SGLangClient
from diag.probe import ProbeOptions, main, probe
from diag.progress import Progress
from diag.prompts import PromptMaker
from emulator.timing import PROFILES, ProfileTiming, ttft_seconds
from tests.conftest import Emulators
from tests.diag.cli import run_main

POOLS = ("--max-total-tokens", "48000", "--page-size", "1", "--enable-metrics")
WRITE_BACK = ("--enable-hierarchical-cache", "--hicache-write-policy", "write_back")
HYBRID_WRITE_THROUGH = (
    "--enable-hierarchical-cache", "--hicache-write-policy", "write_through",
    "--emu-hybrid", "--mamba-scheduler-strategy", "extra_buffer", "--max-mamba-cache-size", "15",
)  # fmt: skip
SEED_S = (15.4, 0.4, 0.1)  # seed 1, write_back: cold, after eviction, again
R = 40_000
R_FLAG = ("--context-tokens", str(R))  # seed 1's R, given: by default R is half the GPU pool (24,000 here)


def scale(s: float) -> tuple[str, str]:
    return ("--emu-time-scale", str(s))


async def transport_floor(url: str, time_scale: float, seed: int) -> float:
    """The least real time a GPU hit of the probe's R (rebuilt from the seed) spends outside the
    emulator's modelled timeline on the replica at ``url``."""
    timing = ProfileTiming(PROFILES["rtx3090x2"], hicache=True)
    async with SGLangClient(url) as client:
        r = (await PromptMaker.create(client, seed, 1)).make(R)
        floors = []
        for _ in range(8):
            g = await client.generate(r.body)
            modelled = ttft_seconds(timing, R, g.cached_tokens or 0, g.host or 0, 0)
            floors.append(g.ttft_s - modelled * time_scale)
    return min(floors)


async def run_cli(*argv: str) -> tuple[int, str, str]:
    return await run_main(main, *argv)


@pytest.mark.slow
async def test_write_back_reuses_the_host_pool_at_seed_ratios(emulator_server: Emulators) -> None:
    time_scale = 0.4
    emu = await emulator_server(*POOLS, *WRITE_BACK, *scale(time_scale))
    result = await probe(emu.url, ProbeOptions(R, seed=7, timeout_s=60), Progress("t", enabled=False))
    floor = await transport_floor(emu.url, time_scale, seed=7)
    modelled = [(g.ttft_s - floor) / time_scale for g in (result.cold, result.after, result.again)]
    print(f"floor {floor * 1000:.2f} ms; modelled s {[round(m, 3) for m in modelled]}")
    assert result.verdict.outcome == "host reuse works"
    assert abs(modelled[0] / SEED_S[0] - 1) <= 0.05  # cold itself: 15.4 s
    for m, seed in zip(modelled[1:], SEED_S[1:], strict=True):
        assert abs((m / modelled[0]) / (seed / SEED_S[0]) - 1) <= 0.2, (m, seed)
    assert (
        result.after.host is not None and result.after.host >= R - 1
    )  # all of R but the one position always computed
    assert result.again.device is not None and result.again.device >= R - 1
    before, middle, end = result.host_used
    assert before == 0 and middle is not None and middle >= R  # R was written back on eviction
    assert end is not None and end >= middle  # reloading R evicted (wrote back) pressure


async def test_write_back_verdict_and_progress_through_the_cli(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    emu = await emulator_server(*POOLS, *WRITE_BACK, *scale(0.05))
    code, out, err = await run_cli(emu.url, "--seed", "3", *R_FLAG, "--plot", str(tmp_path / "probe.png"))
    assert code == 0, err
    assert (tmp_path / "probe.png").read_bytes().startswith(b"\x89PNG")
    assert "verdict: host reuse works" in out
    assert "2 unique contexts of 26,000 tokens" in out
    assert "host pool used (sglang:hicache_host_used_tokens): 0 before -> " in out
    steps = ("1/4 R cold", "2/4 pressure 1/2", "2/4 pressure 2/2", "3/4 R after eviction", "4/4 R again 3/3")
    assert all(step in err for step in steps)
    assert "elapsed" in err and "sent     252,000" in err  # R x 5 + 2 x 26,000


async def test_write_through_on_a_hybrid_model_is_broken(emulator_server: Emulators) -> None:
    emu = await emulator_server(*POOLS, *HYBRID_WRITE_THROUGH, *scale(0.05))
    code, out, err = await run_cli(emu.url, "--json", "--quiet", *R_FLAG)
    assert code == 0 and err == ""
    doc = orjson.loads(out)
    assert doc["verdict"]["outcome"] == "host reuse broken"
    assert "write_through on a hybrid model" in doc["verdict"]["reason"]
    steps = doc["steps"]
    assert steps["after_eviction"]["cached_tokens"] == 0  # recomputed although ...
    assert doc["host_used_tokens"]["after_pressure"] > 2 * R  # ... the host pool filled (seed 1)
    assert steps["after_eviction"]["ttft_s"] > 0.8 * steps["cold"]["ttft_s"]
    assert steps["again"]["device"] >= R - 256  # the GPU side still works


async def test_hicache_off(emulator_server: Emulators) -> None:
    emu = await emulator_server(*POOLS, *scale(0.05))
    code, out, _ = await run_cli(emu.url, "--json", "--quiet", "--seed", "5", *R_FLAG)
    doc = orjson.loads(out)
    assert code == 0 and doc["verdict"]["outcome"] == "HiCache off"
    assert doc["plan"]["high"] is None and doc["plan"]["target_tokens"] == 52_800  # 1.1 x GPU pool
    assert doc["steps"]["after_eviction"]["cached_tokens"] == 0
    assert doc["seed"] == 5 and doc["prompts_as_token_ids"] is True


async def test_without_context_tokens_r_is_sized_to_the_pools(emulator_server: Emulators) -> None:
    """A 16K-token GPU pool: seed 1's 40K R cannot fit, so R is half the pool (said in the report and
    on stderr); an explicit --context-tokens is honoured, and refused when it cannot fit."""
    small = ("--max-total-tokens", "16000", "--page-size", "1", "--enable-metrics")
    emu = await emulator_server(*small, *WRITE_BACK, *scale(0.05))
    code, out, err = await run_cli(emu.url, "--seed", "4")
    note = "R sized to 8,000 tokens, half the smallest GPU pool (16,000 tokens)"
    assert code == 0 and note in out and note in err, err
    assert "R: 8,000 tokens sent" in out and "verdict: host reuse works" in out
    code, _, err = await run_cli(emu.url, "--quiet", "--context-tokens", "12000")
    assert code == 0 and "sized" not in err
    code, _, err = await run_cli(emu.url, "--quiet", "--context-tokens", "40000")
    assert code == 1 and "--context-tokens 40,000 exceeds" in err and "max_req_input_len 15,999" in err
