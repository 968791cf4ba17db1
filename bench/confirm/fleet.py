"""A scenario's replicas as real emulator processes, each launched with the flags its spec calls for.

``replica_flags(spec, ...)`` are the ``kvroute emulate`` flags of one replica of a ``ReplicaSpec``: the same
settings ``bench.sim.replica.emulator_config`` gives the simulated one (profile, GPU pool via
``--max-total-tokens``, HiCache write_back with the spec's host ratio or HiCache off, page size, running
slots, cache report, the scenario's emulator seed, so that every replica samples the same outputs), plus
what a real run needs: ``--time-scale`` (``bench.confirm.workload``), ``--enable-metrics``, ``--emu-debug``
(the ``x-emu-replica`` header) and ``--emu-enable-faults`` (for the speed, below).

Replicas with the same flags share one ``bench.systems.fleet.EmulatorFleet`` process (one per distinct
GPU pool and host ratio: a scenario has 1-6 of them). A replica slower than the profile gets the
emulator's slow factor 1 / speed through its fault endpoint (``{"action": "slow"}``), which sets the very
``Replica.set_slow`` the simulator calls. Replicas that join mid-run are started with the others (idle,
empty caches) and only announced to the router at their time (``bench.confirm.routers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Self

import aiohttp

from bench.sim.spec import ReplicaSpec, Scenario
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ProcessGroup

FLAG_TIMEOUT_S = 5.0


def replica_flags(
    spec: ReplicaSpec, profile: str, seed: int, page_size: int, max_running: int, scale: float
) -> list[str]:
    """The launch flags of a replica of ``spec`` (module docstring), ports aside."""
    hicache = (
        ["--enable-hierarchical-cache", "--hicache-ratio", f"{spec.host_ratio:g}"] if spec.hicache else []
    )
    return [
        "--emu-profile", profile, *hicache, "--hicache-write-policy", "write_back",
        "--max-total-tokens", str(spec.gpu_tokens),
        "--page-size", str(page_size),
        "--max-running-requests", str(max_running),
        "--enable-cache-report", "--enable-metrics", "--emu-debug", "--emu-enable-faults",
        "--time-scale", f"{scale:g}",
        "--emu-seed", str(seed),
    ]  # fmt: skip


def slow_factor(spec: ReplicaSpec) -> float:
    """The emulator's slow factor for the spec's speed (1.0 = the profile's timing)."""
    return 1.0 / spec.speed


def groups(scenario: Scenario, scale: float) -> list[tuple[list[str], list[ReplicaSpec]]]:
    """The replicas grouped by identical flags (one emulator process per group), in spec order."""
    out: dict[tuple[str, ...], list[ReplicaSpec]] = {}
    s = scenario
    for spec in s.replicas:
        flags = replica_flags(spec, s.profile, s.seed, s.page_size, s.max_running_requests, scale)
        out.setdefault(tuple(flags), []).append(spec)
    return [(list(flags), specs) for flags, specs in out.items()]


class ScenarioFleet(ProcessGroup):
    """Every replica of a scenario (joiners too) running, each at its speed; ``urls`` by spec name."""

    def __init__(self, scenario: Scenario, scale: float, logs: Path) -> None:
        super().__init__()
        self._groups = groups(scenario, scale)
        self._logs = logs
        self.urls: dict[str, str] = {}
        self._specs = {r.name: r for r in scenario.replicas}

    async def __aenter__(self) -> Self:
        try:
            for k, (flags, specs) in enumerate(self._groups):
                proc = EmulatorFleet(len(specs), flags, self._logs / f"emulators-{k}.log")
                self._procs.append(await proc.__aenter__())
                self.urls |= {s.name: url for s, url in zip(specs, proc.urls, strict=True)}
            await self._set_speeds()
        except BaseException:
            await self.close()
            raise
        return self

    def urls_of(self, names: Sequence[str]) -> list[str]:
        return [self.urls[n] for n in names]

    async def _set_speeds(self) -> None:
        timeout = aiohttp.ClientTimeout(total=FLAG_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for name, url in self.urls.items():
                factor = slow_factor(self._specs[name])
                if factor != 1.0:
                    await _slow(http, url, factor)


async def _slow(http: aiohttp.ClientSession, url: str, factor: float) -> None:
    async with http.post(url + "/_emu/faults", json={"action": "slow", "factor": factor}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: slow factor {factor:g} refused ({resp.status})")
