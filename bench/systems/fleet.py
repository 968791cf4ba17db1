"""The emulated fleet the benchmark runs on: the process, its launch flags, its shape, its counters.

`EmulatorFleet(n, args)` runs ONE process `python -m emulator --host H --ports P1,...,Pn ARGS` serving n
replicas (a `bench.systems.procs.ManagedProcess`: ready when every replica lists its model, stopped by PID).
The tests, the demo and the benchmarks all start emulated replicas through it; the emulator package itself
knows nothing about it.

Every replica runs SGLang's HiCache write_back setup (`--enable-hierarchical-cache --hicache-write-policy
write_back --hicache-ratio 2`) with `--enable-cache-report --enable-metrics` and the emulator's debug
endpoints (`--emu-debug`: /_emu/state, /_emu/predict, the `x-emu-replica` header). The GPU pool is
capped with `--max-total-tokens` so that workloads whose working set exceeds the fleet's GPU pools stay
small enough to replay in seconds; the host pool is ratio x GPU, as in SGLang. Optionally (exact mode)
every replica tokenizes with a real tokenizer directory (`FleetSpec.tokenizer`) and publishes KV events
in a chosen encoding (`FleetSpec.kv_events`) to consecutive loopback ports (`kv_endpoints`), and for a
workload with outages the fault admin endpoint is on (`FleetSpec.faults`: --emu-enable-faults).

`replica_counters` reads each replica's counters from /_emu/state (requests served, tokens loaded back
from host and storage): the ground truth of per-replica load for every system, including the ones that
do not say where they sent a request. `bench.reports.fleet_work.replica_work` turns them, with the
cached-token reports and the `x-emu-replica` header of each request, into the prefill seconds each replica
spent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.systems.procs import LOOPBACK, ManagedProcess, free_ports, replica_id
from bench.workloads.floor import DEFAULT_PROFILE
from bench.workloads.generators import FleetShape
from emulator.timing import PROFILES, ProfileTiming

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
    profile: str = DEFAULT_PROFILE
    tokenizer: str | None = (
        None  # a tokenizer directory: every replica tokenizes with it (--emu-tokenizer hf)
    )
    kv_events: str | None = None  # a KV-event encoding ("0.5.10" | "0.5.23"): every replica publishes
    faults: bool = False  # --emu-enable-faults (a workload with outages: bench/runs/outages.py)

    @classmethod
    def default(
        cls, replicas: int, quick: bool, time_scale: float | None, gpu_tokens: int | None
    ) -> FleetSpec:
        gpu = gpu_tokens or (24_000 if quick else 48_000)
        return cls(replicas, gpu, DEFAULT_TIME_SCALE if time_scale is None else time_scale)

    @property
    def shape(self) -> FleetShape:
        return FleetShape(self.replicas, self.gpu_tokens, HICACHE_RATIO * self.gpu_tokens)

    @property
    def timing(self) -> ProfileTiming:
        return ProfileTiming(PROFILES[self.profile], hicache=True)

    def args(self, seed: int, kv_port: int | None = None) -> list[str]:
        """The launch flags; with `kv_events`, replica i's PUB connects to 127.0.0.1:(kv_port + i), the
        subscriber binds (kv_port: a free run of `replicas` ports picked now unless given)."""
        faults = ["--emu-enable-faults"] if self.faults else []
        return [*self._base_args(seed), *self._tokenizer_args(), *self._kv_events_args(kv_port), *faults]

    def _tokenizer_args(self) -> list[str]:
        if self.tokenizer is None:
            return []
        return ["--emu-tokenizer", "hf", "--tokenizer-path", self.tokenizer, "--model-path", self.tokenizer]

    def _kv_events_args(self, kv_port: int | None) -> list[str]:
        if self.kv_events is None:
            return []
        port = free_port_run(self.replicas) if kv_port is None else kv_port
        config = {"publisher": "zmq", "endpoint": f"tcp://{LOOPBACK}:{port}"}
        return ["--kv-events-config", json.dumps(config), "--emu-kv-events-format", self.kv_events]

    def kv_endpoints(self, kv_port: int) -> list[str]:
        """Where a subscriber binds to hear each replica (in --ports order) for `args(seed, kv_port)`."""
        return [f"tcp://{LOOPBACK}:{kv_port + i}" for i in range(self.replicas)]

    def _base_args(self, seed: int) -> list[str]:
        return [
            "--emu-profile", self.profile,
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
        named = (("tokenizer", self.tokenizer), ("kv_events", self.kv_events), ("faults", self.faults))
        extra = {k: v for k, v in named if v}
        return extra | {
            "profile": self.profile,
            "replicas": self.replicas,
            "gpu_tokens_per_replica": self.gpu_tokens,
            "host_tokens_per_replica": HICACHE_RATIO * self.gpu_tokens,
            "page_size": self.page_size,
            "time_scale": self.time_scale,
        }


def free_port_run(n: int, host: str = LOOPBACK, attempts: int = 50) -> int:
    """The first of n consecutive ports free right now on `host` (each bound together, then released)."""
    for _ in range(attempts):
        base = free_ports(1, host)[0]
        if base + n <= 65536 and _all_free(range(base, base + n), host):
            return base
    raise OSError(f"no run of {n} free ports on {host}")


def _all_free(ports: range, host: str) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True, slots=True)
class Counters:
    """What one replica reports in /_emu/state that the benchmark uses (all cumulative)."""

    requests: int
    host_loaded: int  # tokens loaded back from the host tier (load_back_tokens_total)
    storage_loaded: int  # tokens prefetched from storage (prefetched_tokens_total)
    lost: int = 0  # cached when a request arrived, evicted before its admission (arrival_lost_tokens_total)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.requests - other.requests,
            self.host_loaded - other.host_loaded,
            self.storage_loaded - other.storage_loaded,
            self.lost - other.lost,
        )


def _int(data: Any, key: str) -> int | None:
    value = data.get(key) if isinstance(data, dict) else None
    return int(value) if isinstance(value, int | float) else None


async def _counters(session: aiohttp.ClientSession, url: str) -> Counters | None:
    try:
        async with session.get(url + "/_emu/state") as resp:
            if resp.status != 200:
                return None
            state = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    cache = state.get("cache") if isinstance(state, dict) else None
    values = (_int(state, "requests_total"), _int(cache, "load_back_tokens_total"),
              _int(cache, "prefetched_tokens_total"))  # fmt: skip
    lost = _int(state, "arrival_lost_tokens_total") or 0
    return None if None in values else Counters(*(v or 0 for v in values), lost)


async def replica_counters(urls: Sequence[str]) -> dict[str, Counters]:
    """{host:port: its counters so far}; empty when any replica does not expose them."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        values = await asyncio.gather(*(_counters(session, u) for u in urls))
    if any(v is None for v in values):
        return {}
    return {replica_id(u): v for u, v in zip(urls, values, strict=True) if v is not None}
