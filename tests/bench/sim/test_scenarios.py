"""The scenario generator: its ranges, its seed sets, and the same scenario for the same seed."""

from __future__ import annotations

import functools
import random

import pytest

from bench.sim.components import OUTPUT_MAX, OUTPUT_MIN
from bench.sim.fleets import MAX_REPLICAS, MIN_REPLICAS, draw_fleet
from bench.sim.jobs import make_jobs
from bench.sim.scenarios import HELDOUT_SEEDS, LOAD_RANGE, SETS, TUNING_SEEDS, draw_with_floor, scenario_seeds
from bench.sim.spec import Scenario
from bench.workloads.floor import FloorRequest
from bench.workloads.shapes import CHAT

SAMPLE = (1000, 1001, 1004, 1010, 1012, 2003, 2004)  # sessions, a burst, RAG, chat, ramps, changes


@functools.cache
def _drawn(seed: int) -> tuple[Scenario, list[FloorRequest]]:
    return draw_with_floor(seed)


def test_the_seed_sets_are_fixed_disjoint_and_a_hundred_each() -> None:
    assert tuple(range(1000, 1100)) == TUNING_SEEDS
    assert tuple(range(2000, 2100)) == HELDOUT_SEEDS
    assert not set(TUNING_SEEDS) & set(HELDOUT_SEEDS)
    assert SETS == {"tuning": TUNING_SEEDS, "heldout": HELDOUT_SEEDS}
    assert scenario_seeds("heldout", 3) == (2000, 2001, 2002)
    assert scenario_seeds("tuning", None) == TUNING_SEEDS


def test_fleets_stay_in_their_ranges() -> None:
    seen_changes = seen_off = seen_slow = 0
    for seed in range(300):
        fleet = draw_fleet(random.Random(seed))
        assert MIN_REPLICAS <= len(fleet.replicas) <= MAX_REPLICAS
        assert all(0.4 <= r.speed <= 1.0 and r.gpu_tokens >= 15_000 for r in fleet.replicas)
        removed = {name for _, kind, name in fleet.changes if kind == "remove"}
        added = {name for _, kind, name in fleet.changes if kind == "add"}
        assert len(fleet.initial) - len(removed) >= 2
        assert added == {r.name for r in fleet.replicas if not r.at_start}
        assert all(0.0 < frac < 1.0 for frac, _, _ in fleet.changes)
        seen_changes += bool(fleet.changes)
        seen_off += any(not r.hicache for r in fleet.replicas)
        seen_slow += any(r.speed < 1.0 for r in fleet.replicas)
    assert min(seen_changes, seen_off, seen_slow) > 30  # each kind of fleet is drawn often


@pytest.mark.parametrize("seed", SAMPLE)
def test_scenarios_stay_in_their_ranges(seed: int) -> None:
    scenario, ideal = _drawn(seed)
    assert LOAD_RANGE[0] <= scenario.load <= LOAD_RANGE[1]
    assert 2 <= len(scenario.replicas) <= 16
    assert 400 <= len(scenario.requests) <= 700
    assert [r.index for r in scenario.requests] == list(range(len(scenario.requests)))
    assert all(r.after is None or r.after < r.index for r in scenario.requests)
    assert all(r.path == CHAT and r.body["stream"] for r in scenario.requests)
    outputs = [int(r.body["max_tokens"]) for r in scenario.requests]
    assert min(outputs) >= OUTPUT_MIN and max(outputs) <= OUTPUT_MAX
    smallest = min(r.gpu_tokens for r in scenario.replicas)
    assert all(f.prompt_tokens + OUTPUT_MAX < smallest for f in ideal)  # every prompt fits every replica
    last = max(r.arrival_s for r in scenario.requests if r.after is None)
    assert all(0.0 < c.at_s <= last for c in scenario.changes)


def test_the_same_seed_draws_the_same_scenario() -> None:
    a, b = draw_with_floor(1010)[0], _drawn(1010)[0]
    assert a == b
    assert make_jobs(a.requests, a.seed) == make_jobs(b.requests, b.seed)
    assert _drawn(1000)[0] != a


def test_sessions_with_and_without_a_header_and_other_components_are_drawn() -> None:
    kinds = {_drawn(seed)[0].kind for seed in SAMPLE}
    parts = {p for kind in kinds for p in kind.split("+")}
    assert {"rag", "sessions", "burst", "chat", "ramp"} <= parts
    turns = [r for seed in (1000, 2004) for r in _drawn(seed)[0].requests if r.tag.endswith("-turn")]
    assert any(r.session is None for r in turns) and any(r.session is not None for r in turns)
