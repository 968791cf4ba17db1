"""Drawing a scenario's fleet from its seed: size, speeds, pools, HiCache, and changes mid-run.

- 2-16 replicas (joiners included) on one timing profile (``rtx3090x2`` twice as often as ``h200``);
- speeds: all equal, two tiers (some replicas at half speed: an older GPU generation), or each drawn in
  0.4-1.0;
- GPU KV pools: one size for all (32K-96K tokens; on ``h200``, whose decode is slow and memory large,
  64K-128K) or each replica 0.5x, 1x or 1.5x of it (at least 16K tokens: a session's prompt may take 60%
  of the smallest pool; at most ``MAX_GPU``); HiCache
  write_back with a host pool of 1-3x the GPU pool on most fleets, off on the rest (a few fleets mix);
- changes (about a third of the fleets): one or two replicas join during the run (empty caches) and/or
  one or two are removed (drained), at fractions of the arrival span; at least two replicas are always
  left to route to.

``DrawnFleet`` keeps the change times as fractions of the span: the arrivals are rescaled to the
offered load after the fleet is drawn, and the changes move with them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.sim.spec import ChangeKind, ReplicaSpec, replica_name

PROFILES = ("rtx3090x2", "rtx3090x2", "h200")
GPU_SIZES = (32_000, 48_000, 64_000, 96_000)
H200_GPU_SIZES = (64_000, 96_000, 128_000)  # an H200 holds ~229K tokens (emulator/timing.py h200_profile)
MAX_GPU = 150_000  # what the emulator's h200 pool leaves with HiCache on (it caps --max-total-tokens there)
MIN_REPLICAS, MAX_REPLICAS = 2, 16


@dataclass(frozen=True, slots=True)
class DrawnFleet:
    profile: str
    replicas: tuple[ReplicaSpec, ...]
    changes: tuple[tuple[float, ChangeKind, str], ...]  # (fraction of the span, kind, replica)

    @property
    def initial(self) -> tuple[ReplicaSpec, ...]:
        return tuple(r for r in self.replicas if r.at_start)

    @property
    def capacity(self) -> float:
        """Prefill-seconds per second of the fleet at the start (bench/workloads/load.py, speeds weighted)."""
        return sum(r.speed for r in self.initial)

    @property
    def min_gpu(self) -> int:
        return min(r.gpu_tokens for r in self.replicas)

    @property
    def gpu_total(self) -> int:
        return sum(r.gpu_tokens for r in self.initial)


def draw_fleet(rng: random.Random) -> DrawnFleet:
    n = rng.randint(MIN_REPLICAS, MAX_REPLICAS)
    profile = rng.choice(PROFILES)
    speeds = _speeds(rng, n)
    gpus = _gpus(rng, n, H200_GPU_SIZES if profile == "h200" else GPU_SIZES)
    hosts = _host_ratios(rng, n)
    specs = [ReplicaSpec(replica_name(i), speeds[i], gpus[i], hosts[i]) for i in range(n)]
    changes: list[tuple[float, ChangeKind, str]] = []
    if rng.random() < 0.35:
        specs, changes = _changes(rng, specs, speeds, gpus, hosts)
    return DrawnFleet(profile, tuple(specs), tuple(sorted(changes)))


def _speeds(rng: random.Random, n: int) -> list[float]:
    mode = rng.choice(("equal", "equal", "tiers", "spread"))
    if mode == "equal":
        return [1.0] * n
    if mode == "tiers":
        return [rng.choice((0.5, 1.0)) for _ in range(n)]
    return [round(rng.uniform(0.4, 1.0), 2) for _ in range(n)]


def _gpus(rng: random.Random, n: int, sizes: tuple[int, ...]) -> list[int]:
    base = rng.choice(sizes)
    if rng.random() < 0.6:
        return [base] * n
    return [min(MAX_GPU, int(base * rng.choice((0.5, 1.0, 1.5))) // 1024 * 1024) for _ in range(n)]


def _host_ratios(rng: random.Random, n: int) -> list[float]:
    mode = rng.choice(("on", "on", "on", "off", "mixed"))
    ratio = float(rng.choice((1, 2, 2, 3)))
    if mode == "on":
        return [ratio] * n
    if mode == "off":
        return [0.0] * n
    return [rng.choice((0.0, ratio)) for _ in range(n)]


def _changes(
    rng: random.Random, specs: list[ReplicaSpec], speeds: list[float], gpus: list[int], hosts: list[float]
) -> tuple[list[ReplicaSpec], list[tuple[float, ChangeKind, str]]]:
    changes: list[tuple[float, ChangeKind, str]] = []
    n = len(specs)
    for k in range(min(rng.choice((0, 1, 2)), MAX_REPLICAS - n)):  # joins: shaped like a drawn one
        like = rng.randrange(n)
        name = replica_name(n + k)
        specs.append(ReplicaSpec(name, speeds[like], gpus[like], hosts[like], at_start=False))
        changes.append((round(rng.uniform(0.2, 0.6), 3), "add", name))
    removable = min(rng.choice((0, 1, 2)), n - MIN_REPLICAS)
    for i in rng.sample(range(n), removable):
        changes.append((round(rng.uniform(0.3, 0.8), 3), "remove", specs[i].name))
    return specs, changes
