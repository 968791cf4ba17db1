"""Every system on one scenario, and the scenario's figures: what ``kvroute bench sim`` runs per seed.

``run_scenario(seed, systems)`` draws the scenario (``bench.sim.scenarios``), prepares its requests once
(``bench.sim.jobs``), simulates each system on a fresh fleet (``bench.sim.simulation``) and computes the
floor (``bench.workloads.floor``: no router can beat it). ``ScenarioResult.summary`` gives the figures the
reports show: per system the mean and p99 TTFT, idle-while-queued seconds, the smallest replica share; and the
ratio of kvroute (its default policy, cost) to the best other system that is not the oracle, by mean
(the system with the lowest mean) and by p99 (the lowest p99, which may be another system).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.sim.gateway import GatewaySystem
from bench.sim.jobs import make_jobs
from bench.sim.oracle import OracleSystem
from bench.sim.results import RunResult, mean, quantile
from bench.sim.scenarios import draw_with_floor
from bench.sim.simulation import simulate
from bench.sim.system import KVROUTE, ORACLE, POLICIES, System

STARVED_SHARE = 0.05  # a replica below this share of the requests while idle as others queue


def make_system(name: str) -> System:
    if name == ORACLE:
        return OracleSystem()
    for policy in POLICIES:
        if policy == name:
            return GatewaySystem(policy)
    raise ValueError(f"unknown system {name!r}; known: {', '.join((*POLICIES, ORACLE))}")


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    seed: int
    description: str
    kind: str
    replicas: int
    load: float
    runs: tuple[RunResult, ...]
    floor_mean_s: float
    floor_p99_s: float

    def run(self, system: str) -> RunResult | None:
        return next((r for r in self.runs if r.system == system), None)

    def ratios(self) -> tuple[float, float, str, str]:
        """(mean ratio, p99 ratio, best other by mean, best other by p99): kvroute / the best other
        non-oracle system; NaN and "" when kvroute or every other system is missing."""
        ours = self.run(KVROUTE)
        others = [r for r in self.runs if r.system not in (KVROUTE, ORACLE)]
        if ours is None or not others:
            return math.nan, math.nan, "", ""
        by_mean = min(others, key=lambda r: r.mean_ttft)
        by_p99 = min(others, key=lambda r: r.p99_ttft)
        return (
            ours.mean_ttft / by_mean.mean_ttft,
            ours.p99_ttft / by_p99.p99_ttft,
            by_mean.system,
            by_p99.system,
        )

    def summary(self) -> dict[str, Any]:
        ratio, p99_ratio, best, best_p99 = self.ratios()
        systems = {r.system: _system_summary(r) for r in self.runs}
        return {
            "seed": self.seed,
            "description": self.description,
            "kind": self.kind,
            "replicas": self.replicas,
            "load": self.load,
            "systems": systems,
            "floor": {"mean_s": self.floor_mean_s, "p99_s": self.floor_p99_s},
            "ratio_mean": ratio,
            "ratio_p99": p99_ratio,
            "best_other": best,
            "best_other_p99": best_p99,
        }


def _system_summary(r: RunResult) -> dict[str, Any]:
    return {
        "mean_s": r.mean_ttft,
        "p99_s": r.p99_ttft,
        "hit_ratio": r.hit_ratio,
        "errors": r.errors,
        "idle_while_queued_s": r.idle_while_queued_s,
        "min_share": r.min_share,
        "starved": [x.replica for x in r.starved(STARVED_SHARE)],
        "shares": {x.replica: x.share for x in r.replicas if x.eligible},
        "idle_while_queued_by_replica": {x.replica: x.idle_while_queued_s for x in r.replicas},
    }


def run_scenario(seed: int, systems: Sequence[str]) -> ScenarioResult:
    scenario, ideal = draw_with_floor(seed)
    jobs = make_jobs(scenario.requests, seed)
    runs = tuple(simulate(scenario, jobs, make_system(name)) for name in systems)
    floor_ttfts = [f.ttft_s for f in ideal]
    return ScenarioResult(
        seed,
        scenario.describe(),
        scenario.kind,
        len(scenario.replicas),
        scenario.load,
        runs,
        mean(floor_ttfts),
        quantile(floor_ttfts, 0.99),
    )
