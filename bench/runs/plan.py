"""What `kvroute bench` runs: points (hardware profile, offered load, seeds) x workloads x systems.

A `Point` is one setting of the fleet: its emulator profile, the offered load its open-loop workloads
are rescaled to (bench/workloads/load.py; None for the closed-loop ones, which run at their own pace) and the
seeds whose mean it reports. The default plan (`make bench`, issue 10):

    profile     load                 seeds    workloads
    rtx3090x2   0.6                  1, 2, 3  rag, rag_user, mixed, hot, noreuse
    rtx3090x2   0.6                  1        rag_restart, rag_tenants
    rtx3090x2   0.3, 0.9             1        rag, rag_user, mixed, hot, noreuse
    h200        0.6                  1        the same
    rtx3090x2   own pace             1        agent, probe

with the seven SWEEP_SYSTEMS. The rag variants (VARIANT_WORKLOADS: rag with a replica restart, rag with
two tenants' cache salts) are open loop like the SWEEP_WORKLOADS but run at the default point only, for
the bench's time budget. `--matrix` is the old `kvroute bench all`: every workload with every system,
on the seeds' profile at load 0.6 and one seed. Naming workloads, loads, profiles or seeds on the
command line builds a custom plan instead (`custom`), where every open-loop workload (OPEN_LOOP) goes
to every named load. Results go to OUT/<profile>/<load-dir>/<workload>/
(`Point.directory`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.floor import DEFAULT_PROFILE as DEFAULT_PROFILE
from emulator.timing import PROFILES as TIMING_PROFILES

PROFILES = tuple(TIMING_PROFILES)

SWEEP_WORKLOADS = ("rag", "rag_user", "mixed", "hot", "noreuse")
VARIANT_WORKLOADS = ("rag_restart", "rag_tenants")  # open loop, at the default point only
OPEN_LOOP = (*SWEEP_WORKLOADS, *VARIANT_WORKLOADS)
OWN_PACE_WORKLOADS = ("agent", "probe")
SWEEP_SYSTEMS = (
    "kvroute-cost",
    "kvroute-cache_aware",
    "kvroute-least_load",
    "sglang-cache_aware",
    "sglang-round_robin",
    "client-rr",
    "oracle",
)
DATACENTER_PROFILE = "h200"
DEFAULT_LOAD = 0.6
# The h200 profile prefills ~2x faster than the seeds' GPUs, so at one offered load its requests come ~2x
# as often in modelled time; running it 2x slower keeps the bench's own CPU demand per wall second (and
# so the CPU noise in modelled TTFT) like the seeds' profile's. Not applied to an explicit --time-scale.
TIME_SCALE_FACTOR = {DATACENTER_PROFILE: 2.0}


@dataclass(frozen=True, slots=True)
class Point:
    profile: str
    load: float | None  # None: closed-loop workloads at their own pace
    seeds: tuple[int, ...]
    workloads: tuple[str, ...]

    @property
    def directory(self) -> str:
        """Where its results go, relative to the output directory: <profile>/load-<x> or /own-pace."""
        return f"{self.profile}/" + ("own-pace" if self.load is None else f"load-{self.load:g}")

    def describe(self) -> str:
        seeds = ", ".join(map(str, self.seeds))
        pace = "own pace" if self.load is None else f"load {self.load:g}"
        return f"profile {self.profile}, {pace}, seed{'s' if len(self.seeds) > 1 else ''} {seeds}"


def seeds_arg(text: str) -> tuple[int, ...]:
    """``--seeds`` of every bench command: distinct integers separated by commas ("1, 2,3")."""
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds, got {text!r}")
    return seeds


def default_plan() -> tuple[Point, ...]:
    return (
        Point(DEFAULT_PROFILE, DEFAULT_LOAD, (1, 2, 3), SWEEP_WORKLOADS),
        Point(DEFAULT_PROFILE, DEFAULT_LOAD, (1,), VARIANT_WORKLOADS),
        Point(DEFAULT_PROFILE, 0.3, (1,), SWEEP_WORKLOADS),
        Point(DEFAULT_PROFILE, 0.9, (1,), SWEEP_WORKLOADS),
        Point(DATACENTER_PROFILE, DEFAULT_LOAD, (1,), SWEEP_WORKLOADS),
        Point(DEFAULT_PROFILE, None, (1,), OWN_PACE_WORKLOADS),
    )


def matrix_plan(seed: int = 1) -> tuple[Point, ...]:
    return (
        Point(DEFAULT_PROFILE, DEFAULT_LOAD, (seed,), OPEN_LOOP),
        Point(DEFAULT_PROFILE, None, (seed,), OWN_PACE_WORKLOADS),
    )


def custom(
    workloads: Sequence[str], loads: Sequence[float], profiles: Sequence[str], seeds: Sequence[int]
) -> tuple[Point, ...]:
    """Every named open-loop workload at every (profile, load); the named own-pace ones once per profile."""
    sweep = tuple(w for w in workloads if w in OPEN_LOOP)
    own = tuple(w for w in workloads if w not in OPEN_LOOP)
    points = [Point(p, load, tuple(seeds), sweep) for p in profiles for load in loads if sweep]
    points += [Point(p, None, tuple(seeds), own) for p in profiles if own]
    return tuple(points)
