"""Systems under test, started from command templates, and the processes behind them.

A system is a command template whose tokens may contain `{port}`, `{python}`, `{free_port}` (another
free loopback port, e.g. for a metrics listener), `{backends}` (expands to one argument per backend URL)
and `{backend_args}` (expands to `--backend URL` pairs), or no command at
all for client-side round robin (the runner rotates the replicas' base URLs itself). `ManagedProcess`
starts a command on a free loopback port with stdout/stderr going to a log file, waits until
`GET /v1/models` answers 200 (or the process dies, which marks the system unavailable with the log's
tail), and on exit terminates its own PID (kill after a timeout). Nothing else is ever signalled.

The emulated fleet is started the same way: one `python -m emulator --ports p1,...` process serving all
replicas, ready when every replica answers `/v1/models`.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import aiohttp

from emulator.launcher import stop_process

KVROUTE_POLICIES = ("cost", "round_robin", "least_load", "cache_aware", "consistent_hash")
SGLANG_POLICIES = ("cache_aware", "round_robin", "power_of_two")
CLIENT_RR = "client-rr"
ORACLE = "oracle"


class SystemUnavailable(RuntimeError):
    """The system's process exited or never became ready; the message says why."""


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
ORACLE_TEMPLATE = "{python} -m bench.oracle --port {port} {backend_args}"
SGLANG_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def default_systems() -> tuple[System, ...]:
    """kvroute's policies, sglang-router's policies, client-side round robin and the oracle."""
    kv = [System(f"kvroute-{p}", tuple(shlex.split(KVROUTE_TEMPLATE % p))) for p in KVROUTE_POLICIES]
    sg = [System(f"sglang-{p}", tuple(shlex.split(SGLANG_TEMPLATE % p)), SGLANG_ENV) for p in SGLANG_POLICIES]
    client = System(CLIENT_RR, note="no proxy: the client rotates replica URLs")
    oracle = System(
        ORACLE, tuple(shlex.split(ORACLE_TEMPLATE)), note="greedy per request: not a strict bound"
    )
    return (*kv, *sg, client, oracle)


def select(names: Sequence[str]) -> tuple[System, ...]:
    """Systems by exact name or by prefix group ('kvroute', 'sglang'); empty means all."""
    systems = default_systems()
    if not names:
        return systems
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


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while choosing, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def wait_ready(urls: Sequence[str], proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll GET {url}/v1/models until every url answers 200; fail fast if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while pending:
            if proc.poll() is not None:
                raise SystemUnavailable(f"exited with code {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise SystemUnavailable(f"not ready after {timeout_s:.0f} s: {pending}")
            pending = [u for u in pending if not await _answers(session, u)]
            if pending:
                await asyncio.sleep(0.1)


async def _answers(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url + "/v1/models") as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


class ManagedProcess:
    """One subprocess we own: started on enter, ready-checked, stopped by PID on exit."""

    def __init__(
        self,
        argv: Sequence[str],
        urls: Sequence[str],
        log: Path,
        env: Mapping[str, str] = {},
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.argv = list(argv)
        self.urls = list(urls)
        self._log = log
        self._env = {**os.environ, **env}
        self._timeout = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> ManagedProcess:
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._proc = self._spawn()
        try:
            await wait_ready(self.urls, self._proc, self._timeout)
        except BaseException as exc:
            self.stop()
            if isinstance(exc, SystemUnavailable):
                raise SystemUnavailable(f"{exc}; log tail: {self.log_tail()}") from None
            raise
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self._log.open("wb") as out:
            return subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env
            )

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_process(proc, grace_s)

    def log_tail(self, chars: int = 400) -> str:
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text[-chars:].strip().splitlines()[-4:])


def emulator_fleet(n: int, args: Sequence[str], log: Path) -> ManagedProcess:
    """n fresh emulated replicas in one process (`python -m emulator --ports ...`)."""
    ports = free_ports(n)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    argv = [sys.executable, "-m", "emulator", "--ports", ",".join(map(str, ports)), *args]
    return ManagedProcess(argv, urls, log, ready_timeout_s=60.0)


def system_process(system: System, backends: Sequence[str], log: Path) -> ManagedProcess:
    port = free_ports(1)[0]
    argv = expand(system.command, port, backends)
    return ManagedProcess(argv, [f"http://127.0.0.1:{port}"], log, env=system.env, ready_timeout_s=60.0)
