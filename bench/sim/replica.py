"""One simulated replica: a real emulator replica (``emulator.replica.Replica.build``) driven in virtual
time, with no HTTP server around it.

``Replica.build`` wires the emulator's radix cache (GPU / host / storage tiers, write_back HiCache),
its chunked-prefill scheduler (``emulator/engine.py``) and its timing profile from an
``EmulatorConfig``, as ``kvroute emulate`` does for each port; the engine task runs on the simulator's
``VirtualLoop``, and the engine reads only the loop's clock, so modelled seconds are virtual seconds
(time scale 1). A replica slower than the profile runs with the emulator's slow factor 1 / speed (every
prefill step, tier load and decode token takes that much longer). Its start time is fixed (the emulator
stamps the wall clock), so nothing in a run depends on when it ran.

``server_info`` is the body the emulator's ``/get_server_info`` answers (``emulator/info_api.py``: the
server args flattened, the scheduler's figures, ``internal_states[0].memory_usage``), built from the same
functions, and ``info`` what the gateway makes of it (``proxy.fleet.replica_info.parse_replica_info``), so
the gateway's view of capacities comes the way it does over HTTP.

Requests go straight into the engine: ``submit`` queues the ``Work`` (arriving now) and returns the
engine's ``Ticket``, whose events (``Prefilled``, ``Emitted``, ``Finished`` / ``Failed``) the simulator
reads. ``predict`` is the engine's own TTFT prediction (``/_emu/predict``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from bench.sim.spec import ReplicaSpec
from emulator.config import EmulatorConfig
from emulator.info_api import VERSION, memory_usage, server_args
from emulator.replica import Replica
from emulator.tickets import Prefilled, Ticket, Work
from proxy.fleet.replica_info import ReplicaInfo, parse_replica_info

SERVED_MODEL = "default"  # the model the workloads name (bench.workloads.shapes.MODEL)


def emulator_config(
    spec: ReplicaSpec, profile: str, seed: int, page_size: int, max_running: int
) -> EmulatorConfig:
    """The flags a replica of this spec is launched with (as ``bench.systems.fleet.FleetSpec`` launches
    them)."""
    return EmulatorConfig(
        served_model_name=SERVED_MODEL,
        emu_profile=profile,
        hicache=spec.hicache,
        hicache_ratio=spec.host_ratio if spec.hicache else 2.0,
        hicache_write_policy="write_back",
        max_total_tokens=spec.gpu_tokens,
        page_size=page_size,
        max_running_requests=max_running,
        enable_cache_report=True,
        time_scale=1.0,
        emu_seed=seed,
    )


@dataclass(slots=True)
class Counters:
    """The engine's listener in the simulator (``emulator.tickets.EngineListener``): plain counts in place
    of the replica's Prometheus registry, which nothing scrapes here and which the engine calls per token."""

    admitted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0

    def on_admit(self, queue_s: float, prefilled: Prefilled, prompt_tokens: int) -> None:
        self.admitted += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += prefilled.cached_tokens

    def on_step(self, hit_tokens: int, new_tokens: int) -> None:
        """Nothing is counted per step."""

    def on_tokens(self, count: int) -> None:
        self.generated_tokens += count


class SimReplica:
    """One emulated replica and its engine task (module docstring)."""

    def __init__(self, spec: ReplicaSpec, cfg: EmulatorConfig, index: int) -> None:
        self.spec = spec
        self.id = spec.name
        self.emu = Replica.build(cfg, 30_000 + index)
        self.emu.startup_time = float(index + 1)
        self.emu.set_slow(1.0 / spec.speed)
        self.counters = Counters()
        self.emu.engine.listener = self.counters  # not Prometheus: nothing scrapes it, and it is per token
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.emu.engine.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, work: Work) -> Ticket:
        return self.emu.engine.submit(work)

    def predict_ttft(self, work: Work) -> float:
        """The engine's predicted TTFT of ``work`` arriving now, with the request's own part (its
        loads, prefill and overhead) slowed like the engine slows it (``Engine.predict`` applies the slow
        factor to the queue ahead only)."""
        p = self.emu.engine.predict(work.prompt, work.extra_key)
        return p.queue_s + (p.ttft_s - p.queue_s) * self.emu.engine.slow_factor

    def server_info(self) -> dict[str, Any]:
        """The ``/get_server_info`` body (``emulator.info_api.server_info``, minus its throughput gauge,
        which reads the wall clock and no router uses)."""
        r, args = self.emu, server_args(self.emu)
        internal = dict(args) | {
            "memory_usage": memory_usage(r),
            "effective_max_running_requests_per_dp": r.cfg.max_running_requests,
        }
        return args | {
            "status": "ready",
            "max_total_num_tokens": r.cfg.gpu_tokens,
            "max_req_input_len": r.cfg.max_req_input_len,
            "internal_states": [internal],
            "version": VERSION,
            "startup_time": r.startup_time,
        }

    def info(self) -> ReplicaInfo:
        return parse_replica_info(self.server_info(), {})
