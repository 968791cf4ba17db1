"""A real ``redis-server`` of our own: the benchmarks' and the tests' one implementation.

``RedisServer`` runs Debian's ``redis-server`` on a free 127.0.0.1 port (or the one given), with no
persistence (``--save "" --appendonly no``), waits until it answers PING and stops exactly the PID it
started (SIGTERM, then SIGKILL after a grace period: ``bench.systems.procs.stop_process``). ``stop()`` then
``start()`` brings it back empty on the same port (a Redis restart). It works as a context manager;
``redis_server()`` is the short form that yields the URL.

A machine without ``redis-server`` raises ``RedisNotInstalled`` (the tests turn it into a skip, the
benchmarks into a message naming the package).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Self

import redis

from bench.systems.procs import LOOPBACK, free_ports, stop_process

START_TIMEOUT_S = 10.0


class RedisNotInstalled(RuntimeError):
    """No ``redis-server`` on this machine (Debian's package ``redis-server`` has it)."""


def executable() -> str:
    """The path of ``redis-server``; RedisNotInstalled when there is none."""
    exe = shutil.which("redis-server") or shutil.which("/usr/bin/redis-server")
    if exe is None:
        raise RedisNotInstalled("redis-server is not installed (apt-get install redis-server)")
    return exe


class RedisServer:
    """One ``redis-server`` process we own (see the module docstring)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=2.0)

    def start(self) -> Self:
        """Spawns it and waits for PING; RuntimeError (after stopping it) when it does not answer."""
        exe, port = executable(), str(self.port)
        args = [exe, "--port", port, "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self._answers():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def _answers(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        """Stops this process (by its PID) and waits for it."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server of our own on a free loopback port; yields its URL; stopped by PID.
    SystemExit with the package's name when it is not installed (for the benchmarks' command lines)."""
    try:
        server = RedisServer().start()
    except RedisNotInstalled as exc:
        raise SystemExit(str(exc)) from None
    try:
        yield server.url
    finally:
        server.stop()
