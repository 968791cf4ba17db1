"""A workload prepared for a run: settings of a benchmark run, and one seed's workload at a point of the
plan, rescaled to the point's offered load, with its floor, its fleet and its wall-clock deadline.

Open-loop workloads are rescaled (``bench.workloads.load.at_load``) and their deadline is 60 s + 4 x
the arrival span in wall seconds, capped by ``max_run_s``; closed-loop ones run to the cap itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bench.runs.plan import TIME_SCALE_FACTOR, Point
from bench.systems import registry as systems
from bench.systems.fleet import FleetSpec
from bench.workloads import floor, load
from bench.workloads import generators as workloads


@dataclass(frozen=True, slots=True)
class RunSettings:
    systems: tuple[systems.System, ...]
    fleet: FleetSpec  # replicas, GPU pool, page size; the profile and time scale are set per point
    quick: bool
    out_dir: Path
    max_run_s: float
    command: str
    time_scale: float | None = None  # None: each workload's own (Workload.time_scale)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A seed's workload at the point, its floor, its offered load and the fleet to run it on."""

    workload: workloads.Workload
    ideal: list[floor.FloorRequest]
    offered: load.OfferedLoad
    fleet: FleetSpec
    deadline_s: float


def prepare(run: RunSettings, point: Point, name: str, seed: int) -> Prepared:
    fleet = replace(run.fleet, profile=point.profile)
    wl = workloads.build(name, seed, fleet.shape, run.quick)
    own = wl.time_scale * TIME_SCALE_FACTOR.get(point.profile, 1.0)
    fleet = replace(fleet, time_scale=run.time_scale or own, faults=bool(wl.outages))
    ideal = floor.floor(wl, fleet.page_size, point.profile, fleet.tokenizer)
    if point.load is not None:
        wl, offered = load.at_load(wl, ideal, point.load, fleet.replicas)
        deadline = min(run.max_run_s, 60.0 + 4.0 * offered.span_s * fleet.time_scale)
    else:
        offered, deadline = load.offered(wl, ideal, fleet.replicas), run.max_run_s
    return Prepared(wl, ideal, offered, fleet, deadline)
