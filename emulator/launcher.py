"""Start and stop emulated fleets as subprocesses (tests, the benchmark, the demo).

`EmulatorFleet(n, args)` runs ONE process `python -m emulator --ports P1,...,Pn <args>` that serves all
n replicas, waits (30 s at most) until it printed one ready line per replica, and on exit terminates
exactly that PID (then kills it after 5 s). It works as a sync context manager, an async context
manager, or with explicit start()/stop().
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

READY_PREFIX = "kvroute-emulator ready "
_ROOT = Path(__file__).resolve().parent.parent


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports free right now on host (bound then released; a small race is possible)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """Stops a subprocess we started, by its PID: terminate, then kill after ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)


class EmulatorFleet:
    def __init__(
        self,
        n: int,
        args: Sequence[str] = (),
        ports: Sequence[int] | None = None,
        host: str = "127.0.0.1",
        timeout: float = 30.0,
    ) -> None:
        self.ports = list(ports) if ports is not None else free_ports(n, host)
        if len(self.ports) != n:
            raise ValueError("len(ports) must equal n")
        self.args = list(args)
        self.host = host
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_lines: list[str] = []
        self._threads: list[threading.Thread] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    def start(self) -> EmulatorFleet:
        cmd = [sys.executable, "-m", "emulator", "--host", self.host]
        cmd += ["--ports", ",".join(map(str, self.ports)), *self.args]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(_ROOT)
        )
        ready = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(ready,), daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()
        if not ready.wait(self.timeout) or self.proc.poll() is not None:
            tail = "".join(self.stderr_lines[-20:])
            self.stop()
            raise RuntimeError(f"emulator fleet did not become ready: {tail}")
        return self

    def _read_stdout(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        seen = 0
        for line in self.proc.stdout:
            if line.startswith(READY_PREFIX):
                seen += 1
                if seen == len(self.ports):
                    ready.set()

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if len(self.stderr_lines) < 1000:
                self.stderr_lines.append(line)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_process(proc)
        for t in self._threads:
            t.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __enter__(self) -> EmulatorFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmulatorFleet:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Block until a TCP connect to url's host:port succeeds (helper for subprocess peers)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((parts.hostname, parts.port or 80), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not accept connections within {timeout} s")
