"""The offered load (bench/workloads/load.py): rescaled workloads carry the load they were asked for, computed
back from their arrivals and the emulator's timing model independently of the module."""

from __future__ import annotations

import pytest

from bench.workloads import generators as workloads
from bench.workloads import load
from bench.workloads.floor import floor
from bench.workloads.generators import FleetShape
from emulator.timing import PROFILES, ProfileTiming

SHAPE = FleetShape(replicas=4, gpu_tokens=12_000, host_tokens=24_000)


def _load_back(wl: workloads.Workload, profile: str, replicas: int) -> tuple[float, float]:
    """(sum of the floor's prefill seconds, sum of cold prefill seconds) / (replicas x arrival span)."""
    timing = ProfileTiming(PROFILES[profile])
    ideal = floor(wl, 16, profile)
    arrivals = [r.arrival_s for r in wl.requests]
    capacity = replicas * (max(arrivals) - min(arrivals))
    work = sum(timing.prefill_seconds(f.cached_tokens, f.prompt_tokens) for f in ideal)
    cold = sum(timing.prefill_seconds(0, f.prompt_tokens) for f in ideal)
    return work / capacity, cold / capacity


@pytest.mark.parametrize("profile", ["rtx3090x2", "h200"])
@pytest.mark.parametrize("name", ["rag", "rag_user", "hot", "mixed", "noreuse"])
def test_a_rescaled_workload_offers_the_asked_load(name: str, profile: str) -> None:
    wl = workloads.build(name, 2, SHAPE, quick=True)
    ideal = floor(wl, 16, profile)
    for asked in (0.3, 0.9):
        scaled, offered = load.at_load(wl, ideal, asked, SHAPE.replicas)
        rho, cold = _load_back(scaled, profile, SHAPE.replicas)
        assert rho == pytest.approx(asked, rel=0.03) and offered.floor == pytest.approx(asked, rel=1e-9)
        assert offered.cold == pytest.approx(cold, rel=1e-6) and cold >= rho
        assert offered.peak >= asked  # the busiest tenth of the span carries at least the mean
        assert [r.body for r in scaled.requests] == [r.body for r in wl.requests]
    slow, fast = (load.at_load(wl, ideal, x, 4)[0] for x in (0.3, 0.9))
    assert load.arrival_span(slow) == pytest.approx(3 * load.arrival_span(fast))
    if name == "noreuse":  # nothing to reuse: the cold load is the load
        assert load.offered(wl, ideal, 4).cold == pytest.approx(load.offered(wl, ideal, 4).floor, rel=0.01)


def test_reuse_makes_the_cold_load_a_multiple_and_closed_loops_cannot_be_scaled() -> None:
    wl = workloads.rag(2, SHAPE)
    offered = load.offered(wl, floor(wl, 16), 4)
    assert offered.cold > 3 * offered.floor
    probe = workloads.probe(2, SHAPE, quick=True)
    with pytest.raises(ValueError, match="closed loop"):
        load.at_load(probe, floor(probe, 16), 0.5, 4)
    with pytest.raises(ValueError, match="positive"):
        load.at_load(wl, floor(wl, 16), 0.0, 4)
