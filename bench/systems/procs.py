"""Processes the benchmarks, the demo and the tests start: free ports, readiness, served model, stop by PID.

`ManagedProcess` starts one command with stdout and stderr going to a log file (a temporary one when no
path is given, so that a failure can still quote the log's tail), waits until every URL it serves is
ready, and stops exactly the PID it started: SIGTERM, then SIGKILL after a grace period. Nothing else is
ever signalled. It works as a sync or an async context manager (the async one runs the blocking start
and stop in a thread), or with explicit start()/stop().

Readiness: `GET {url}{path}` answers 200 with a JSON body that `check` accepts; the default is
`/v1/models` listing at least one model (what the OpenAI SDK needs first). The wait fails fast with the
log's tail when the process exits, and after `timeout_s` otherwise.

`free_ports(n)` binds n loopback sockets together (so the ports are distinct), reads their ports and
closes them: another process may take one before we use it, a small race every harness of this kind has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import aiohttp

LOOPBACK = "127.0.0.1"
ReadyCheck = Callable[[Any], bool]


class NotReady(RuntimeError):
    """The process exited or never became ready; the message says why (with its log's tail)."""


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """n distinct ports free right now on `host` (bound together, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """Stop a subprocess we started, by its PID: terminate, then kill after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)


def lists_a_model(doc: Any) -> bool:
    """The default readiness check: a `/v1/models` body with at least one model."""
    return isinstance(doc, dict) and bool(doc.get("data"))


def _ready(url: str, check: ReadyCheck) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200 and check(json.loads(resp.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(
    urls: Sequence[str],
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    path: str = "/v1/models",
    check: ReadyCheck = lists_a_model,
) -> None:
    """Poll every `url + path` until `check` accepts its JSON; NotReady if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        if proc.poll() is not None:
            raise NotReady(f"exited with code {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise NotReady(f"not ready after {timeout_s:.0f} s: {pending}")
        pending = [u for u in pending if not _ready(u + path, check)]
        if pending:
            time.sleep(0.1)


async def served_model(base_url: str) -> str | None:
    """The first model id that `GET /v1/models` lists (None when it lists none or is not JSON)."""
    async with aiohttp.ClientSession() as session, session.get(base_url + "/v1/models") as resp:
        raw = await resp.read()
    try:
        models = json.loads(raw).get("data") or []
        return str(models[0]["id"]) if models else None
    except (ValueError, AttributeError, KeyError, TypeError, IndexError):
        return None


class ManagedProcess:
    """One subprocess we own: started, ready-checked, stopped by PID."""

    def __init__(
        self,
        argv: Sequence[str],
        urls: Sequence[str],
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 60.0,
        ready_path: str = "/v1/models",
        ready_check: ReadyCheck = lists_a_model,
    ) -> None:
        self.argv = list(argv)
        self.urls = list(urls)
        self._log_path = log
        self._env = {**os.environ, **(env or {})}
        self._timeout = ready_timeout_s
        self._ready = (ready_path, ready_check)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        """Spawn the process and wait until it is ready; on failure stop it and raise NotReady."""
        self._log = self._open_log()
        self._proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env
        )
        try:
            wait_ready(self.urls, self._proc, self._timeout, *self._ready)
        except NotReady as exc:
            tail = self.log_tail()
            self.close()
            raise NotReady(f"{exc}; log tail: {tail}") from None
        except BaseException:
            self.close()
            raise
        return self

    def _open_log(self) -> IO[bytes]:
        if self._log_path is None:
            return tempfile.TemporaryFile()
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        return self._log_path.open("w+b")

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, grace_s)

    def log_text(self) -> str:
        """Everything the process wrote so far (stdout and stderr interleaved)."""
        if self._log is None or self._log.closed:
            return ""
        self._log.flush()
        fd = self._log.fileno()  # shared with the child: read at offset 0 without moving its offset
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def log_tail(self, lines: int = 4) -> str:
        return " | ".join(self.log_text().strip().splitlines()[-lines:])[-400:]

    def close(self) -> None:
        """Stop the process and close its log (a temporary log is deleted)."""
        self.stop()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:  # the thread still starts it: wait for that, then stop it
            with contextlib.suppress(Exception):
                await starting
            await asyncio.to_thread(self.close)
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.close)


class ProcessGroup:
    """Processes started together (``_procs``, in order) and closed together, by PID, in a thread each:
    an async context manager whose ``__aenter__`` the subclass writes (closing what it started if a
    start fails)."""

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        procs, self._procs = self._procs, []
        for proc in procs:
            await asyncio.to_thread(proc.close)


def replica_id(value: str) -> str:
    """Normalise 'http://host:port/' and 'host:port' to 'host:port'."""
    return value.split("://", 1)[-1].rstrip("/")
