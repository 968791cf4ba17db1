"""End to end, small: a tiny scenario through the real kvroute gateway and real emulators, with a replica
joining and one drained midway (a few seconds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.confirm.trial import run_trial
from bench.confirm.workload import translate
from bench.sim.jobs import make_jobs
from bench.sim.spec import FleetChange, ReplicaSpec, Scenario, SimRequest, replica_name
from bench.workloads.shapes import CHAT, chat


def _tiny() -> Scenario:
    replicas = (
        ReplicaSpec(replica_name(0), 1.0, 16_000, 2.0),
        ReplicaSpec(replica_name(1), 0.5, 16_000, 0.0),
        ReplicaSpec(replica_name(2), 1.0, 16_000, 2.0, at_start=False),
    )
    changes = (FleetChange(0.5, "add", replica_name(2)), FleetChange(1.0, "remove", replica_name(1)))
    bodies = [
        chat([{"role": "user", "content": f"Question {i} about the manual, briefly."}], 8) for i in range(20)
    ]
    requests = tuple(
        SimRequest(i, 0.1 * i, CHAT, b, "chat", "s1" if i % 2 else None) for i, b in enumerate(bodies)
    )
    return Scenario(5, "tiny", "rtx3090x2", 0.3, replicas, changes, requests)


def test_a_tiny_scenario_runs_for_real_through_kvroute(tmp_path: Path) -> None:
    scenario = _tiny()
    workload = translate(scenario, make_jobs(scenario.requests, scenario.seed), 1.0)
    run = asyncio.run(run_trial(scenario, workload, "cost", tmp_path, 30.0))
    assert run.errors == 0, run.first_error
    assert len(run.ttfts) == 20 and all(t > 0 for t in run.ttfts)
    assert run.change_errors == ()
    assert run.idle_while_queued_s is not None
