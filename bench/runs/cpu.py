"""How much of the machine's CPU other processes used while a benchmark run was going (Linux).

The fleet benchmark measures TTFT in modelled seconds = wall seconds / time scale, so on a shared
machine another process that takes a core for a minute inflates every TTFT of the runs it overlaps
(by up to 1 / time scale times its stall). `CpuMeter` tells such runs apart:

    busy    = delta of the non-idle jiffies of /proc/stat's "cpu" line / CLK_TCK     (whole machine)
    ours    = delta of os.times() user + system + children_user + children_system   (this process and
              the children it has reaped: the emulators and systems of the run are reaped at its end)
    foreign = max(0, busy - ours) / wall                                             (cores on average)

A child still running when the meter stops counts as foreign (its CPU joins `ours` only when reaped).
Where /proc/stat is missing (not Linux) the meter reports NaN.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
NAN = float("nan")


def _busy_seconds() -> float:
    """Non-idle CPU seconds of the whole machine since boot (user nice system irq softirq steal)."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return NAN
    jiffies = [int(x) for x in fields[1:9]]
    idle = jiffies[3] + jiffies[4]  # idle + iowait
    return (sum(jiffies) - idle) / os.sysconf("SC_CLK_TCK")


def _our_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass(frozen=True, slots=True)
class CpuUse:
    wall_s: float
    busy_cores: float  # the whole machine, on average over the wall time
    foreign_cores: float  # processes other than this one and its reaped children


class CpuMeter:
    """start() ... stop() -> CpuUse over that interval."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), _busy_seconds(), _our_seconds())

    def stop(self) -> CpuUse:
        wall0, busy0, ours0 = self._start
        wall = time.monotonic() - wall0
        busy, ours = _busy_seconds() - busy0, _our_seconds() - ours0
        if wall <= 0 or busy != busy:
            return CpuUse(wall, NAN, NAN)
        return CpuUse(wall, busy / wall, max(0.0, busy - ours) / wall)
