"""A scenario as real requests: the same bodies, paths, links and headers, every time scaled alike; and
the emulator flags of a replica spec are the simulator's settings."""

from __future__ import annotations

import dataclasses

import pytest

from bench.confirm.fleet import groups, replica_flags, slow_factor
from bench.confirm.workload import MAX_SCALE, MIN_SCALE, time_scale, translate
from bench.sim.jobs import make_jobs
from bench.sim.replica import emulator_config
from bench.sim.scenarios import draw
from bench.sim.spec import ReplicaSpec, Scenario
from emulator.config import parse_args

SEED = 1010  # rag + sessions with a header, joins and removals mid-run


def _first(scenario: Scenario, n: int) -> Scenario:
    kept = tuple(r for r in scenario.requests if r.index < n)
    return dataclasses.replace(scenario, requests=kept)


def test_time_scale_aims_at_the_wall_target_within_bounds() -> None:
    assert time_scale(40.0, 40.0) == 1.0
    assert time_scale(20.0, 40.0) == 2.0
    assert time_scale(80.0, 40.0) == 0.5
    assert time_scale(1.0, 40.0) == MAX_SCALE
    assert time_scale(10_000.0, 40.0) == MIN_SCALE
    assert time_scale(0.0) == 1.0


def test_translation_keeps_every_request_and_scales_every_time_alike() -> None:
    scenario = _first(draw(SEED), 120)
    jobs = make_jobs(scenario.requests, scenario.seed)
    w = translate(scenario, jobs, 1.5)
    assert [r.index for r in w.requests] == [r.index for r in scenario.requests]
    for sim, real, job in zip(scenario.requests, w.requests, jobs, strict=True):
        assert (real.path, dict(real.body), real.tag, real.after) == (
            sim.path,
            dict(sim.body),
            sim.tag,
            sim.after,
        )
        assert real.arrival_s == pytest.approx(1.5 * sim.arrival_s)
        assert real.think_s == pytest.approx(1.5 * sim.think_s)
        assert real.expected_prompt_tokens == job.prompt_tokens
    assert [c.at_s for c in w.changes] == pytest.approx([1.5 * c.at_s for c in scenario.changes])
    assert [(c.kind, c.replica) for c in w.changes] == [(c.kind, c.replica) for c in scenario.changes]


def test_the_session_header_goes_exactly_where_the_scenario_has_one() -> None:
    scenario = _first(draw(SEED), 120)
    w = translate(scenario, make_jobs(scenario.requests, scenario.seed), 1.0)
    with_header = {r.index for r in scenario.requests if r.session is not None}
    assert with_header and with_header != {r.index for r in scenario.requests}
    assert w.sticky == with_header
    sessions = {r.index: r.session for r in scenario.requests}
    assert all(r.session == sessions[r.index] for r in w.requests if r.index in w.sticky)


def test_children_link_each_turn_to_the_one_it_follows() -> None:
    scenario = _first(draw(SEED), 120)
    w = translate(scenario, make_jobs(scenario.requests, scenario.seed), 1.0)
    links = {(r.after, r.index) for r in scenario.requests if r.after is not None}
    assert {(p, c.index) for p, cs in w.children().items() for c in cs} == links


FIELDS = ("emu_profile", "hicache", "hicache_ratio", "hicache_write_policy", "max_total_tokens", "page_size",
          "max_running_requests", "enable_cache_report", "emu_seed")  # fmt: skip


@pytest.mark.parametrize("spec", [ReplicaSpec("a", 0.5, 32_000, 2.0), ReplicaSpec("b", 1.0, 96_000, 0.0),
                                  ReplicaSpec("c", 0.8, 48_000, 3.0)])  # fmt: skip
def test_replica_flags_launch_what_the_simulator_simulates(spec: ReplicaSpec) -> None:
    real = parse_args(["--port", "30000", *replica_flags(spec, "h200", 7, 16, 32, 1.25)])
    sim = emulator_config(spec, "h200", 7, 16, 32)
    assert {f: getattr(real, f) for f in FIELDS} == {f: getattr(sim, f) for f in FIELDS}
    assert real.gpu_tokens == sim.gpu_tokens and real.host_tokens == sim.host_tokens
    assert real.time_scale == 1.25 and real.emu_enable_faults
    assert slow_factor(spec) == pytest.approx(1.0 / spec.speed)


def test_replicas_with_the_same_flags_share_one_process() -> None:
    specs = (ReplicaSpec("a", 0.5, 32_000, 2.0), ReplicaSpec("b", 1.0, 32_000, 2.0),
             ReplicaSpec("c", 1.0, 64_000, 2.0), ReplicaSpec("d", 1.0, 32_000, 0.0))  # fmt: skip
    scenario = Scenario(3, "x", "rtx3090x2", 0.5, specs, (), ())
    assert [[s.name for s in g] for _, g in groups(scenario, 1.0)] == [["a", "b"], ["c"], ["d"]]
