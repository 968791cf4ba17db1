"""The figures of the overhead bench, per run and as the median over runs, and the issue's verdicts.

Within one run, for each case and target: ``added_p50_ms`` / ``added_p99_ms`` = the target's percentile
minus ``direct``'s in the same run; ``kept`` = the target's requests/s over ``direct``'s (how much of the
replica's throughput survives the hop); ``kept_vs_peer`` = the target's ``kept`` over sglang-router's
(the issue's "req/s kept >= 0.8x sglang-router's"); ``cpu_ms`` = CPU ms per request of the target's
process tree. A ``Row`` holds one case and target: every figure's value in each run, and their median
(runs whose value is NaN are left out of it). The issue's targets (``cases.Goal``) are judged on the
``kvroute`` row's medians only: that is kvroute as shipped (default policy, plus ``--kvroute-args``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.overhead.cases import Goal
from bench.overhead.requests import Result

DIRECT, KVROUTE, PEER = "direct", "kvroute", "sglang-router"
FIGURES = ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "rps", "kept", "kept_vs_peer", "cpu_ms")
NAN = float("nan")
Key = tuple[str, int]


def median(xs: Sequence[float]) -> float:
    """The median of the values that are not NaN (NaN when there are none)."""
    kept = [x for x in xs if not math.isnan(x)]
    return statistics.median(kept) if kept else NAN


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else NAN


def run_figures(run: Sequence[Result]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(case, concurrency, target) -> every figure of one run."""
    direct = {(r.scenario, r.concurrency): r for r in run if r.target == DIRECT}
    peer = {(r.scenario, r.concurrency): r for r in run if r.target == PEER}
    out = {}
    for r in run:
        d, p = direct[(r.scenario, r.concurrency)], peer.get((r.scenario, r.concurrency))
        kept = ratio(r.rps, d.rps)
        out[(r.scenario, r.concurrency, r.target)] = {
            "p50_ms": r.p50_ms,
            "p99_ms": r.p99_ms,
            "added_p50_ms": r.p50_ms - d.p50_ms,
            "added_p99_ms": r.p99_ms - d.p99_ms,
            "rps": r.rps,
            "kept": kept,
            "kept_vs_peer": ratio(kept, ratio(p.rps, d.rps)) if p is not None else NAN,
            "cpu_ms": r.cpu_ms,
        }
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    goal: Goal
    value: float

    @property
    def met(self) -> bool | None:
        return None if math.isnan(self.value) else self.goal.met(self.value)


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    concurrency: int
    target: str
    requests: int  # over all runs
    errors: int
    per_run: Mapping[str, Sequence[float]]  # figure -> its value in each run
    goals: tuple[Goal, ...] = ()

    def median(self, figure: str) -> float:
        return median(self.per_run[figure])

    def verdicts(self) -> list[Verdict]:
        if self.target != KVROUTE:
            return []
        return [Verdict(g, self.median(g.figure)) for g in self.goals]

    def doc(self) -> dict[str, object]:
        verdicts = [{"goal": v.goal.describe(), "value": v.value, "met": v.met} for v in self.verdicts()]
        return {
            "case": self.case,
            "concurrency": self.concurrency,
            "target": self.target,
            "requests": self.requests,
            "errors": self.errors,
            "median": {f: self.median(f) for f in FIGURES},
            "per_run": {f: list(self.per_run[f]) for f in FIGURES},
            "verdicts": verdicts,
        }


def rows(runs: Sequence[Sequence[Result]], goals: Mapping[Key, tuple[Goal, ...]]) -> list[Row]:
    """One row per (case, target) in the first run's order, its figures gathered from every run."""
    figures = [run_figures(run) for run in runs]
    results = [{(r.scenario, r.concurrency, r.target): r for r in run} for run in runs]
    out = []
    for key in dict.fromkeys(k for run in figures for k in run):
        case, conc, target = key
        per_run = {f: [fig[key][f] if key in fig else NAN for fig in figures] for f in FIGURES}
        n = sum(res[key].requests for res in results if key in res)
        err = sum(res[key].errors for res in results if key in res)
        out.append(Row(case, conc, target, n, err, per_run, goals.get((case, conc), ())))
    return out
