"""The emulated fleet the benchmark runs on: the process, its launch flags, its shape, its counters.

`EmulatorFleet(n, args)` runs ONE process `python -m emulator --host H --ports P1,...,Pn ARGS` serving n
replicas (a `bench.procs.ManagedProcess`: ready when every replica lists its model, stopped by PID). The
tests, the demo and the benchmarks all start emulated replicas through it; the emulator package itself
knows nothing about it.

Every replica runs SGLang's HiCache write_back setup (`--enable-hierarchical-cache --hicache-write-policy
write_back --hicache-ratio 2`) with `--enable-cache-report --enable-metrics` and the emulator's debug
endpoints (`--emu-debug`: /_emu/state, /_emu/predict, the `x-emu-replica` header). The GPU pool is
capped with `--max-total-tokens` so that workloads whose working set exceeds the fleet's GPU pools stay
small enough to replay in seconds; the host pool is ratio x GPU, as in SGLang.

`replica_counters` reads each replica's `requests_total` from /_emu/state: the ground truth of
per-replica load for every system, including the ones that do not say where they sent a request.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import LOOPBACK, ManagedProcess, free_ports
from bench.runner import replica_id
from bench.workloads import FleetShape

DEFAULT_TIME_SCALE = 0.05
HICACHE_RATIO = 2


class EmulatorFleet(ManagedProcess):
    """n emulated SGLang replicas in one `python -m emulator` process on free loopback ports."""

    def __init__(
        self,
        n: int,
        args: Sequence[str] = (),
        log: Path | None = None,
        ports: Sequence[int] | None = None,
        host: str = LOOPBACK,
        timeout_s: float = 60.0,
    ) -> None:
        self.ports = list(ports) if ports is not None else free_ports(n, host)
        if len(self.ports) != n:
            raise ValueError(f"{n} replicas need {n} ports, got {len(self.ports)}")
        argv = [sys.executable, "-m", "emulator", "--host", host, "--ports", ",".join(map(str, self.ports))]
        urls = [f"http://{host}:{p}" for p in self.ports]
        super().__init__([*argv, *args], urls, log, ready_timeout_s=timeout_s)


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int
    gpu_tokens: int
    time_scale: float
    page_size: int = 16
    max_running_requests: int = 32

    @classmethod
    def default(
        cls, replicas: int, quick: bool, time_scale: float | None, gpu_tokens: int | None
    ) -> FleetSpec:
        gpu = gpu_tokens or (24_000 if quick else 48_000)
        return cls(replicas, gpu, DEFAULT_TIME_SCALE if time_scale is None else time_scale)

    @property
    def shape(self) -> FleetShape:
        return FleetShape(self.replicas, self.gpu_tokens, HICACHE_RATIO * self.gpu_tokens)

    def args(self, seed: int) -> list[str]:
        return [
            "--enable-hierarchical-cache",
            "--hicache-write-policy", "write_back",
            "--hicache-ratio", str(HICACHE_RATIO),
            "--enable-cache-report",
            "--enable-metrics",
            "--emu-debug",
            "--time-scale", str(self.time_scale),
            "--max-total-tokens", str(self.gpu_tokens),
            "--page-size", str(self.page_size),
            "--max-running-requests", str(self.max_running_requests),
            "--emu-seed", str(seed),
        ]  # fmt: skip

    def meta(self) -> dict[str, object]:
        return {
            "replicas": self.replicas,
            "gpu_tokens_per_replica": self.gpu_tokens,
            "host_tokens_per_replica": HICACHE_RATIO * self.gpu_tokens,
            "page_size": self.page_size,
            "time_scale": self.time_scale,
        }


def _find(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        if key in data:
            return data[key]
        for value in data.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


async def _counter(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url + "/_emu/state") as resp:
            if resp.status != 200:
                return None
            value = _find(await resp.json(), "requests_total")
            return int(value) if isinstance(value, int | float) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def replica_counters(urls: Sequence[str]) -> dict[str, int]:
    """{host:port: requests served so far}; empty when any replica does not expose the counter."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        values = await asyncio.gather(*(_counter(session, u) for u in urls))
    if any(v is None for v in values):
        return {}
    return {replica_id(u): int(v or 0) for u, v in zip(urls, values, strict=True)}
