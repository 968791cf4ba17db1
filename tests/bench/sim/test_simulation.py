"""Whole runs in the simulator: bit-identical twice, and each policy doing what it is for."""

from __future__ import annotations

import json

import pytest

from bench.sim.jobs import Job, make_jobs
from bench.sim.oracle import OracleSystem
from bench.sim.runner import make_system
from bench.sim.scenarios import draw
from bench.sim.simulation import simulate
from bench.sim.spec import ReplicaSpec, Scenario, SimRequest, replica_name
from bench.sim.system import SYSTEMS, Routed
from bench.workloads.rag import rag_messages
from bench.workloads.shapes import CHAT, chat
from bench.workloads.text import WordSource


def _first(scenario: Scenario, n: int) -> Scenario:
    """The scenario's first n requests (a session's turn always follows an earlier index)."""
    kept = tuple(r for r in scenario.requests if r.index < n)
    assert all(r.after is None or r.after < n for r in kept)
    return Scenario(scenario.seed, scenario.kind, scenario.profile, scenario.load, scenario.replicas,
                    scenario.changes, kept)  # fmt: skip


def test_a_scenario_runs_bit_identically_twice_for_every_system() -> None:
    scenario = _first(draw(1010), 90)  # rag + sessions with a header, joins and removals mid-run
    assert scenario.changes
    for name in SYSTEMS:
        runs = []
        for _ in range(2):
            jobs = make_jobs(scenario.requests, scenario.seed)
            runs.append(json.dumps(simulate(scenario, jobs, make_system(name)).to_json(), sort_keys=True))
        assert runs[0] == runs[1], name
        assert len(json.loads(runs[0])["requests"]) == 90


def _repeated_document(count: int, gap_s: float) -> Scenario:
    """``count`` questions on one 3K-token document, one every ``gap_s`` (no queueing), on 4 equal
    replicas."""
    words = WordSource(7)
    doc = words.document("Manual", 3000)
    questions = [f"Question {i}: {words.sentences(30)}" for i in range(count)]
    bodies = [chat(rag_messages("system", doc, q), 32, stream=True) for q in questions]
    requests = tuple(SimRequest(i, i * gap_s, CHAT, body, "rag") for i, body in enumerate(bodies))
    replicas = tuple(ReplicaSpec(replica_name(i)) for i in range(4))
    return Scenario(1, "repeat", "rtx3090x2", 0.1, replicas, (), requests)


def test_round_robin_spreads_evenly_and_cost_keeps_a_repeated_document_on_one_replica() -> None:
    scenario = _repeated_document(40, 3.0)
    jobs = make_jobs(scenario.requests, 1)
    rr = simulate(scenario, jobs, make_system("round_robin"))
    assert [r.requests for r in rr.replicas] == [10, 10, 10, 10]
    cost = simulate(scenario, jobs, make_system("cost"))
    counts = sorted((r.requests for r in cost.replicas), reverse=True)
    assert counts[0] >= 38, counts
    assert cost.hit_ratio > rr.hit_ratio
    assert cost.mean_ttft < rr.mean_ttft
    assert cost.idle_while_queued_s == 0.0  # nothing ever queues at this pace


def test_every_request_is_answered_with_its_usage() -> None:
    scenario = _repeated_document(8, 2.0)
    jobs = make_jobs(scenario.requests, 1)
    run = simulate(scenario, jobs, make_system("oracle"))
    assert [r.index for r in run.requests] == list(range(8))
    assert run.errors == 0
    assert all(r.prompt_tokens == j.prompt_tokens for r, j in zip(run.requests, jobs, strict=True))
    assert run.requests[0].cached_tokens == 0
    assert all(r.cached_tokens > 3000 for r in run.requests[1:])  # the document, on whichever replica
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in run.requests)
    assert run.end_s > 14.0


class _Broken(OracleSystem):
    """Routes like the oracle until request 3, then fails."""

    def route(self, job: Job, now: float) -> Routed:
        if job.index == 3:
            raise RuntimeError("no route for request 3")
        return super().route(job, now)


def test_a_failure_inside_the_run_stops_it_with_that_error() -> None:
    scenario = _repeated_document(6, 1.0)
    with pytest.raises(RuntimeError, match="no route for request 3"):
        simulate(scenario, make_jobs(scenario.requests, 1), _Broken())
