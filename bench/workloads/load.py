"""Offered load: how hard a workload pushes the fleet, as a fraction of its prefill capacity.

Definition (issue 10). The emulator's prefill engine is one serial resource per replica (emulator/
engine.py: prefill and tier loads run in steps, one step at a time; decode does not share it), so a
fleet of R replicas has R prefill-seconds of capacity per second. The work a request brings is the
prefill a perfect router must still spend on it: the floor's `work_s` (bench/workloads/floor.py; every earlier
prefix already on GPU, so only the new tail is computed). Over the workload's arrival span T (last
arrival - first arrival, modelled seconds):

    offered load       rho      = sum_i work_i / (R * T)
    in cold terms      rho_cold = sum_i cold_i / (R * T)      (cold_i: the whole prompt computed)

rho < 1 is a load a perfect router can serve without a growing queue on average; rho_cold is what a
router that never reuses anything would face (many times rho on reuse-heavy workloads, equal on
`noreuse`). Work need not arrive evenly: on rag most documents are first seen (cold) early in the run.
`peak` is the largest rho over PEAK_WINDOWS equal windows of the span (each request's work counted in
the window of its arrival).

`at_load(workload, rho, ...)` multiplies every arrival time by T_now * rho_now / rho (the work does not
depend on time, so the load scales as 1 / T): the same requests in the same order, arriving faster or
slower. Only open-loop workloads (`Workload.sweep`) are rescaled; closed-loop ones (agent sessions, the
sequential probe) depend on when their previous request finished and run at their own pace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.workloads.floor import FloorRequest
from bench.workloads.generators import Workload

NAN = float("nan")
PEAK_WINDOWS = 10


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    floor: float  # sum of the floor's prefill seconds / (replicas x span)
    cold: float  # sum of cold prefill seconds / (replicas x span)
    span_s: float  # last arrival - first arrival (modelled seconds)
    work_s: float  # sum of the floor's prefill seconds
    cold_s: float  # sum of cold prefill seconds
    peak: float = NAN  # the largest load over PEAK_WINDOWS equal windows of the span

    def describe(self) -> str:
        return (
            f"offered load {self.floor:.2f} of prefill capacity (peak {self.peak:.2f} over a tenth of the"
            f" span; {self.cold:.2f} in cold-prefill terms)"
        )


def arrival_span(workload: Workload) -> float:
    """Last minus first arrival of the open-loop requests (modelled seconds)."""
    times = [r.arrival_s for r in workload.requests if r.after is None]
    return max(times) - min(times) if len(times) > 1 else 0.0


def offered(workload: Workload, ideal: Sequence[FloorRequest], replicas: int) -> OfferedLoad:
    """The offered load of `workload` on `replicas` replicas; `ideal` is its floor
    (bench.workloads.floor.floor, on the fleet's profile and page size), which does not depend on arrival
    times."""
    work, cold = sum(f.work_s for f in ideal), sum(f.cold_s for f in ideal)
    span = arrival_span(workload)
    capacity = replicas * span
    if not capacity:
        return OfferedLoad(NAN, NAN, span, work, cold)
    return OfferedLoad(work / capacity, cold / capacity, span, work, cold, _peak(workload, ideal, capacity))


def _peak(workload: Workload, ideal: Sequence[FloorRequest], capacity: float) -> float:
    open_loop = [r for r in workload.requests if r.after is None]
    start = min(r.arrival_s for r in open_loop)
    span = max(r.arrival_s for r in open_loop) - start
    windows = [0.0] * PEAK_WINDOWS
    work = {f.index: f.work_s for f in ideal}
    for r in open_loop:
        windows[min(PEAK_WINDOWS - 1, int(PEAK_WINDOWS * (r.arrival_s - start) / span))] += work.get(
            r.index, 0.0
        )
    return max(windows) / (capacity / PEAK_WINDOWS)


def at_load(
    workload: Workload, ideal: Sequence[FloorRequest], load: float, replicas: int
) -> tuple[Workload, OfferedLoad]:
    """`workload` with its arrivals rescaled so that its offered load is `load`, and that load."""
    if not workload.sweep:
        raise ValueError(f"{workload.name} is closed loop: its load follows the system, it cannot be set")
    if not load > 0:
        raise ValueError(f"the offered load must be positive, got {load}")
    now = offered(workload, ideal, replicas)
    if not now.floor > 0:
        raise ValueError(f"{workload.name} has no arrival span or no work to scale")
    factor = now.floor / load
    scaled = replace(
        workload, requests=tuple(replace(r, arrival_s=r.arrival_s * factor) for r in workload.requests)
    )
    return scaled, offered(scaled, ideal, replicas)


def mean_load(loads: Sequence[OfferedLoad]) -> OfferedLoad:
    """Field by field mean (the seeds of one point: same load, slightly different cold load)."""
    n = len(loads)
    return OfferedLoad(
        *(sum(getattr(x, f) for x in loads) / n for f in ("floor", "cold", "span_s", "work_s", "cold_s"))
    )
