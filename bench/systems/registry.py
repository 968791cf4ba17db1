"""Systems under test, started from command templates (as processes of `bench.systems.procs`).

A system is a command template whose tokens may contain `{port}`, `{python}`, `{free_port}` (another
free loopback port, e.g. for a metrics listener), `{backends}` (expands to one argument per backend URL)
and `{backend_args}` (expands to `--backend URL` pairs), or no command at
all for client-side round robin (the runner rotates the replicas' base URLs itself). A system's process
runs on a free loopback port with its output in a log file; it is ready when `GET /v1/models` lists a
model, or for a router when its status (kvroute `/status`, sglang-router `/readiness`) counts every
backend healthy; a process that exits first marks
the system unavailable (`bench.systems.procs.NotReady`, with the log's tail).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.systems.procs import LOOPBACK, ManagedProcess, ReadyCheck, free_ports

KVROUTE_POLICIES = ("cost", "round_robin", "least_load", "cache_aware", "consistent_hash")
SGLANG_POLICIES = ("cache_aware", "round_robin", "power_of_two")
CLIENT_RR = "client-rr"
ORACLE = "oracle"


@dataclass(frozen=True, slots=True)
class System:
    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def proxied(self) -> bool:
        return bool(self.command)


KVROUTE_TEMPLATE = "{python} -m proxy.cli serve --host 127.0.0.1 --port {port} {backend_args} --policy %s"
SGLANG_TEMPLATE = (
    "{python} -m sglang_router.launch_router --host 127.0.0.1 --port {port} --worker-urls {backends}"
    " --policy %s --log-level warn --prometheus-host 127.0.0.1 --prometheus-port {free_port}"
)
ORACLE_TEMPLATE = "{python} -m bench.systems.oracle --port {port} {backend_args}"
SGLANG_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def kvroute(policy: str, *extra: str) -> System:
    """`kvroute serve` with `policy` over the backends, plus `extra` flags."""
    return System(f"kvroute-{policy}", (*shlex.split(KVROUTE_TEMPLATE % policy), *extra))


def default_systems() -> tuple[System, ...]:
    """kvroute's policies, sglang-router's policies, client-side round robin and the oracle."""
    kv = [kvroute(p) for p in KVROUTE_POLICIES]
    sg = [System(f"sglang-{p}", tuple(shlex.split(SGLANG_TEMPLATE % p)), SGLANG_ENV) for p in SGLANG_POLICIES]
    client = System(CLIENT_RR, note="no proxy: the client rotates replica URLs")
    oracle = System(
        ORACLE, tuple(shlex.split(ORACLE_TEMPLATE)), note="greedy per request: not a strict bound"
    )
    return (*kv, *sg, client, oracle)


def named_only() -> tuple[System, ...]:
    """Systems run only when named: kvroute's default policy as N ``--workers`` processes on one port."""
    return tuple(
        dataclasses.replace(kvroute("cost", "--workers", str(n)), name=f"kvroute-cost-workers{n}")
        for n in (2, 4)
    )


def select(names: Sequence[str]) -> tuple[System, ...]:
    """Systems by exact name or by prefix group ('kvroute', 'sglang'); empty means all the defaults
    (``named_only`` ones run when named exactly)."""
    if not names:
        return default_systems()
    systems = (*default_systems(), *(s for s in named_only() if s.name in names))
    chosen = [s for s in systems if any(s.name == n or s.name.startswith(n + "-") for n in names)]
    unknown = [n for n in names if not any(s.name == n or s.name.startswith(n + "-") for s in systems)]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {[s.name for s in systems]}")
    return tuple(chosen)


def expand(template: Sequence[str], port: int, backends: Sequence[str]) -> list[str]:
    argv: list[str] = []
    for token in template:
        if token == "{backends}":
            argv.extend(backends)
        elif token == "{backend_args}":
            for url in backends:
                argv += ["--backend", url]
        else:
            if "{free_port}" in token:
                token = token.replace("{free_port}", str(free_ports(1)[0]))
            argv.append(token.replace("{port}", str(port)).replace("{python}", sys.executable))
    return argv


def counts(key: str, n: int) -> ReadyCheck:
    """Readiness of a router: its status document says `key` == n (every backend registered and
    healthy). Both routers listen, and answer `/v1/models` through one backend, before that."""
    return lambda doc: isinstance(doc, dict) and doc.get(key) == n


READY_PATHS = {"kvroute-": ("/status", "healthy_replicas"), "sglang-": ("/readiness", "healthy_workers")}


def system_process(
    system: System, backends: Sequence[str], log: Path, port: int | None = None
) -> ManagedProcess:
    """The system's process on `port` or a free loopback port (`bench.systems.procs`: ready-checked, stopped
    by PID)."""
    port = port or free_ports(1)[0]
    argv = expand(system.command, port, backends)
    url = f"http://{LOOPBACK}:{port}"
    for prefix, (path, key) in READY_PATHS.items():
        if system.name.startswith(prefix):
            return ManagedProcess(argv, [url], log, system.env, 60.0, path, counts(key, len(backends)))
    return ManagedProcess(argv, [url], log, system.env, 60.0)
