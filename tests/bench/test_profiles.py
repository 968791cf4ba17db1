"""The datacenter profile (emulator/timing.py `h200`) reproduces the measurements it was fitted to, and
an emulated replica started with `--emu-profile h200` runs on it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from bench.systems.fleet import EmulatorFleet
from emulator.timing import PROFILES, ProfileTiming, fit_prefill, ttft_seconds

H200 = ProfileTiming(PROFILES["h200"])


@pytest.mark.parametrize(("tokens", "rate"), [(8_000, 7_000.0), (40_000, 5_200.0)])
def test_cold_prefill_rates_over_the_whole_prompt(tokens: int, rate: float) -> None:
    assert tokens / H200.prefill_seconds(0, tokens) == pytest.approx(rate, rel=0.05)


def test_a_question_on_40k_cached_tokens_takes_0_26_s_and_host_reload_runs_at_55_gb_s() -> None:
    assert ttft_seconds(H200, 40_064, 40_000, 0, 0) == pytest.approx(0.26, rel=0.05)
    assert 40_000 / H200.load_seconds(40_000, 0) * 256 * 1024 == pytest.approx(55e9, rel=0.05)
    p = PROFILES["h200"]
    assert p.kv_bytes_per_token == 256 * 1024
    assert p.gpu_kv_tokens * p.kv_bytes_per_token == pytest.approx(0.88 * 141e9 - 64e9, rel=0.01)
    assert 0.2 < p.overhead < 0.26 and p.b > 0  # superlinear: attention grows with position


def test_fit_prefill_solves_both_points_exactly() -> None:
    a, b = fit_prefill(1_000, 2_000.0, 9_000, 1_500.0)
    for n, r in ((1_000, 2_000.0), (9_000, 1_500.0)):
        assert a * n + b * n * n / 2 == pytest.approx(n / r)


async def test_an_emulated_replica_on_the_h200_profile(tmp_path: Path) -> None:
    args = ["--emu-profile", "h200", "--emu-debug", "--emu-time-scale", "0.001"]
    async with EmulatorFleet(1, args, tmp_path / "emu.log") as fleet, aiohttp.ClientSession() as http:
        url = fleet.urls[0]
        async with http.get(url + "/get_server_info") as resp:
            info = await resp.json()
        payload = {"path": "/generate", "body": {"input_ids": list(range(8_000)), "sampling_params": {}}}
        async with http.post(url + "/_emu/predict", json=payload) as resp:
            cold = await resp.json()
    assert info["max_total_num_tokens"] == PROFILES["h200"].gpu_kv_tokens
    assert cold["ttft_s"] == pytest.approx(ttft_seconds(H200, 8_000, 0, 0, 0))
    assert cold["ttft_s"] == pytest.approx(8_000 / 7_000 + PROFILES["h200"].overhead, rel=0.05)
