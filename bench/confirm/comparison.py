"""The real runs against the simulated ones: per scenario and over a set.

Per scenario and per system, mean and p99 TTFT (modelled seconds) real and simulated; kvroute's ratio
(``cost`` / the best other system by mean TTFT, as ``bench.sim.runner`` defines it, over the systems
compared: the oracle is never one of them) real and simulated; whether the real ratio is within
``TOLERANCE`` (10%) of the simulated one (``|real / sim - 1| <= 0.10``); whether the systems are ranked
alike (the same order by mean TTFT); kvroute's idle-while-queued seconds, real (its /metrics) and
simulated.

Over a set: the geometric mean of the real ratios and of the simulated ones, the worst real ratio, how
many scenarios are within 10% and ranked alike, and the issue's targets: real geomean <= 0.90, no real
ratio above 1.10, every real ratio within 10% of the simulator's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.sim.report import geomean
from bench.sim.system import KVROUTE

TOLERANCE = 0.10
TARGET_GEOMEAN = 0.90
TARGET_WORST = 1.10


@dataclass(frozen=True, slots=True)
class Figures:
    mean_s: float
    p99_s: float
    errors: int = 0
    idle_while_queued_s: float | None = None


def kvroute_ratio(means: Mapping[str, float]) -> tuple[float, str]:
    """(kvroute's mean / the best other's, the best other); (NaN, "") without kvroute or another."""
    others = {s: m for s, m in means.items() if s != KVROUTE and math.isfinite(m)}
    if KVROUTE not in means or not others:
        return math.nan, ""
    best = min(others, key=lambda s: others[s])
    return means[KVROUTE] / others[best], best


def within(real: float, sim: float, tolerance: float = TOLERANCE) -> bool:
    """The real ratio is within ``tolerance`` of the simulated one (relative to it)."""
    return math.isfinite(real) and math.isfinite(sim) and sim > 0 and abs(real / sim - 1.0) <= tolerance


def ranking(means: Mapping[str, float]) -> list[str]:
    """The systems by mean TTFT, best first (ties by name)."""
    return sorted(means, key=lambda s: (means[s], s))


def scenario_row(
    head: Mapping[str, Any], real: Mapping[str, Figures], sim: Mapping[str, Figures]
) -> dict[str, Any]:
    """One scenario's comparison; ``head``: seed, description, scale, notes, wall seconds."""
    real_means = {s: f.mean_s for s, f in real.items()}
    sim_means = {s: f.mean_s for s, f in sim.items() if s in real}
    r_ratio, r_best = kvroute_ratio(real_means)
    s_ratio, s_best = kvroute_ratio(sim_means)
    return dict(head) | {
        "real": {s: asdict(f) for s, f in real.items()},
        "sim": {s: asdict(f) for s, f in sim.items()},
        "ratio_real": r_ratio,
        "ratio_sim": s_ratio,
        "best_other_real": r_best,
        "best_other_sim": s_best,
        "within": within(r_ratio, s_ratio),
        "rank_real": ranking(real_means),
        "rank_sim": ranking(sim_means),
        "ranked_alike": ranking(real_means) == ranking(sim_means),
    }


def set_summary(
    name: str, command: str, systems: Sequence[str], rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    real = [r["ratio_real"] for r in rows]
    finite = [(x, r["seed"]) for x, r in zip(real, rows, strict=True) if math.isfinite(x)]
    worst, worst_seed = max(finite) if finite else (math.nan, None)
    g = geomean(real)
    return {
        "set": name,
        "command": command,
        "systems": list(systems),
        "scenarios_run": len(rows),
        "geomean_ratio_real": g,
        "geomean_ratio_sim": geomean([r["ratio_sim"] for r in rows]),
        "worst_ratio_real": worst,
        "worst_seed": worst_seed,
        "within_count": sum(bool(r["within"]) for r in rows),
        "ranked_alike_count": sum(bool(r["ranked_alike"]) for r in rows),
        "targets": _targets(g, worst, rows),
        "scenarios": list(rows),
    }


def _targets(g: float, worst: float, rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    return {
        f"real geomean <= {TARGET_GEOMEAN:.2f}": bool(g <= TARGET_GEOMEAN),
        f"no real ratio > {TARGET_WORST:.2f}": bool(rows) and bool(worst <= TARGET_WORST),
        "every real ratio within 10% of the simulator's": bool(rows) and all(r["within"] for r in rows),
    }
