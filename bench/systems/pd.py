"""Prefill/decode (PD) fleets and the systems that route them (bench/pd.py).

``PdFleet(spec, prefills, decodes, seed, logs)`` starts the emulated PD servers with the bench's launch flags
(``FleetSpec.args``): the prefill servers in one ``kvroute emulate`` process with HiCache write_back (SGLang
allows HiCache on a prefill server) and ``--disaggregation-mode prefill``, each with its bootstrap server on
a free loopback port (the contract's defaults otherwise: mooncake, 20 GB/s modelled transfer); each decode
server in a process of its own, without HiCache (SGLang refuses it on a decode server: it keeps no radix
cache), so that one decode server can be killed alone (``kill_decode``). An async context manager.

The same GPUs: the bench caps every replica's KV pool (``--max-total-tokens``, ``FleetSpec``) below what
its GPU holds with HiCache on, which costs ~31.5% of the pool (``emu_hicache_gpu_cost``, emulator/config.py:
233,207 tokens without it, 159,692 with it, seed 2). A decode server runs without HiCache, so its cap is
the same GPU's pool without that cost: the prefill servers' cap / (1 - 0.315).

PD systems are command templates as in ``bench.systems.registry``, with two more tokens: ``{prefill_args}``
(kvroute: ``--prefill URL --prefill-bootstrap-port PORT`` per prefill server; sglang-router:
``--prefill URL PORT``) and ``{decode_args}`` (``--decode URL`` per decode server). A system is ready when
its status counts every PD server healthy (kvroute ``/status`` ``healthy_replicas``, sglang-router
``/readiness`` ``healthy_workers``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from bench.systems.fleet import EmulatorFleet, FleetSpec, free_port_run
from bench.systems.procs import LOOPBACK, ManagedProcess, free_ports
from bench.systems.registry import READY_PATHS, SGLANG_ENV, System, counts, expand

HICACHE = ("--enable-hierarchical-cache", "--hicache-write-policy", "--hicache-ratio")
HICACHE_GPU_COST = (
    0.315  # the share of a GPU's KV pool HiCache takes (emulator/config.py emu_hicache_gpu_cost)
)
KVROUTE_PD = (
    "{python} -m proxy.cli serve --host 127.0.0.1 --port {port} {prefill_args} {decode_args} --policy cost"
)
SGLANG_PD = (
    "{python} -m sglang_router.launch_router --host 127.0.0.1 --port {port} --pd-disaggregation"
    " {prefill_args} {decode_args} --policy %s --log-level warn --prometheus-host 127.0.0.1"
    " --prometheus-port {free_port}"
)


def pd_systems() -> tuple[System, ...]:
    """kvroute over the pairs (the cost model picks prefills, decode_placement decodes), sglang-router's PD
    mode with cache_aware and round_robin."""
    kv = System("kvroute-pd", tuple(shlex.split(KVROUTE_PD)), note="kvroute --prefill/--decode")
    sg = [
        System(f"sglang-pd-{p}", tuple(shlex.split(SGLANG_PD % p)), SGLANG_ENV, note="sglang-router --pd")
        for p in ("cache_aware", "round_robin")
    ]
    return (kv, *sg)


def without_hicache(args: Sequence[str]) -> list[str]:
    """The launch flags without HiCache's (each of them takes a value but the switch), the KV pool cap
    raised by what HiCache would have cost the same GPU (module docstring)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in HICACHE:
            skip = a != "--enable-hierarchical-cache"
        else:
            out.append(a)
    if "--max-total-tokens" in out:
        i = out.index("--max-total-tokens") + 1
        out[i] = str(int(int(out[i]) / (1.0 - HICACHE_GPU_COST)))
    return out


def _bootstrap_ports(n: int, taken: Sequence[int]) -> list[int]:
    """n consecutive free ports, none of them ``taken``."""
    for _ in range(20):
        first = free_port_run(n)
        run = list(range(first, first + n))
        if not set(run) & set(taken):
            return run
    raise OSError(f"no run of {n} free ports apart from {list(taken)}")


class PdFleet:
    """See the module docstring."""

    def __init__(self, spec: FleetSpec, prefills: int, decodes: int, seed: int, logs: Path) -> None:
        ports = free_ports(prefills + decodes)
        self.bootstrap = _bootstrap_ports(prefills, ports)  # replica i's bootstrap server: the first + i
        base = spec.args(seed)
        pd = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(self.bootstrap[0])]
        self.prefill_proc = EmulatorFleet(
            prefills, [*base, *pd], logs / "prefill.emulator.log", ports[:prefills]
        )
        decode_args = [*without_hicache(base), "--disaggregation-mode", "decode"]
        self.decode_procs = [
            EmulatorFleet(1, decode_args, logs / f"decode-{i}.emulator.log", [p])
            for i, p in enumerate(ports[prefills:])
        ]
        self.prefills = self.prefill_proc.urls
        self.decodes = [p.urls[0] for p in self.decode_procs]

    @property
    def urls(self) -> list[str]:
        return [*self.prefills, *self.decodes]

    def kill_decode(self, i: int) -> None:
        """SIGKILL decode server i's process: it dies unannounced, its connections reset."""
        pid = self.decode_procs[i].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def system_process(self, system: System, log: Path) -> ManagedProcess:
        """The system's process over this fleet, on a free loopback port."""
        port = free_ports(1)[0]
        kvroute = system.name.startswith("kvroute-")
        prefill_args: list[str] = []
        for url, boot in zip(self.prefills, self.bootstrap, strict=True):
            prefill_args += ["--prefill", url, *(["--prefill-bootstrap-port"] if kvroute else []), str(boot)]
        decode_args = [a for url in self.decodes for a in ("--decode", url)]
        template: list[str] = []
        for token in system.command:
            template += (
                prefill_args
                if token == "{prefill_args}"
                else decode_args
                if token == "{decode_args}"
                else [token]
            )
        argv = expand(template, port, self.urls)
        path, key = READY_PATHS["kvroute-" if kvroute else "sglang-"]
        url = f"http://{LOOPBACK}:{port}"
        return ManagedProcess(argv, [url], log, system.env, 60.0, path, counts(key, len(self.urls)))

    async def __aenter__(self) -> Self:
        async with contextlib.AsyncExitStack() as stack:
            for proc in (self.prefill_proc, *self.decode_procs):
                await stack.enter_async_context(proc)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()
