"""Several gateway processes on one port: the supervisor of ``kvroute serve --workers N``.

The supervisor serves no request itself. It holds the port (``reserve_port``: bound, not listening, with
``SO_REUSEPORT``; a port 0 becomes a free one here), then starts N workers: the same ``kvroute serve``
command line with ``--workers 1``, that port, and ``KVROUTE_WORKER`` (the worker's index) in their
environment, which makes each listen with ``SO_REUSEPORT`` (the kernel spreads new connections over
them) and drain when the supervisor goes (its stdin, a pipe from the supervisor, ends:
``proxy/runtime/serving.py``). Each worker is in a session of its own, so a terminal's Ctrl-C reaches the
supervisor alone, which passes it on once. Workers log to the supervisor's stderr.

- **Ready**: once every worker printed its ready line, the supervisor prints its own, once (``kvroute
  ready URL TIMESTAMP``). A worker that exits before it was ready stops the start: the others are
  stopped and the supervisor exits with that worker's status (a port in use, a bad file: it would fail
  again).
- **A worker dies** (any exit that no signal asked for): it is restarted after a backoff
  (``RestartPolicy``: 0.5 s doubling to 10 s with the deaths of the last minute); a fifth death within
  a minute means the workers keep dying: the others are stopped and the supervisor exits 1.
- **SIGTERM or SIGINT**: forwarded as SIGTERM to every worker, which drains (``proxy/runtime/drain.py``);
  the supervisor waits for them (at most their ``drain_timeout`` + ``STOP_GRACE_S``, then kills) and
  exits 0 when every worker did, else 1. A second signal is forwarded too: the workers stop at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kvroute.workers")
WORKER_ENV = "KVROUTE_WORKER"
STOP_GRACE_S = 5.0
READY_PREFIX = "kvroute ready "


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_s: float = 0.5
    max_s: float = 10.0
    window_s: float = 60.0
    max_deaths: int = 5

    def delay_s(self, deaths: Sequence[float], now: float) -> float | None:
        """The wait before the next restart, given the times of the deaths so far (the last one now);
        None: too many within ``window_s``, give up."""
        recent = sum(1 for t in deaths if now - t < self.window_s)
        if recent >= self.max_deaths:
            return None
        return float(min(self.max_s, self.first_s * 2 ** max(0, recent - 1)))


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``, not listening: the port is the workers'
    while it is open; OSError when it is taken."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class Worker:
    index: int
    proc: asyncio.subprocess.Process
    ready: bool = False
    url: str = ""


@dataclass
class Supervisor:
    argv: list[str]  # a worker's command line
    count: int
    drain_timeout_s: float
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    workers: dict[int, Worker] = field(default_factory=dict)
    _events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    _deaths: list[float] = field(default_factory=list)
    _watches: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, announce: Callable[[str], None]) -> int:
        """Starts the workers, announces the URL once all are ready, supervises; the exit status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._events.put_nowait, ("signal", sig))
        try:
            for i in range(self.count):
                await self._spawn(i)
            status = await self._start()
            return status if status is not None else await self._supervise(announce)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self._stop(self.drain_timeout_s + STOP_GRACE_S)

    async def _spawn(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self.env | {WORKER_ENV: str(index)},
            start_new_session=True,
        )
        worker = self.workers[index] = Worker(index, proc)
        log.info("worker %d started (pid %d)", index, proc.pid)
        task = asyncio.get_running_loop().create_task(self._watch(worker))
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _watch(self, worker: Worker) -> None:
        """Its ready line, then the rest of its stdout passed on; its exit."""
        assert worker.proc.stdout is not None
        async for raw in worker.proc.stdout:
            line = raw.decode(errors="replace")
            if not worker.ready and line.startswith(READY_PREFIX):
                worker.ready, worker.url = True, line.split()[2]
                self._events.put_nowait(("ready", worker))
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        self._events.put_nowait(("exit", worker, await worker.proc.wait()))

    async def _start(self) -> int | None:
        """Until every worker is ready: None; or the exit status when one failed or a signal came."""
        while not all(w.ready for w in self.workers.values()):
            event = await self._events.get()
            if event[0] == "signal":
                return await self._drain()
            if event[0] == "exit":
                worker, code = event[1], event[2]
                log.error("worker %d exited with status %d before it was ready: stopping", worker.index, code)
                await self._stop(self.drain_timeout_s + STOP_GRACE_S)
                return code if code > 0 else 1
        return None

    async def _supervise(self, announce: Callable[[str], None]) -> int:
        announce(next(iter(self.workers.values())).url)
        while True:
            event = await self._events.get()
            if event[0] == "signal":
                return await self._drain()
            if event[0] == "exit" and not self._died(event[1], event[2]):
                await self._stop(self.drain_timeout_s + STOP_GRACE_S)
                return 1
            if event[0] == "restart":
                await self._spawn(event[1])
            elif event[0] == "ready":
                log.info("worker %d ready (pid %d)", event[1].index, event[1].proc.pid)

    def _died(self, worker: Worker, code: int) -> bool:
        """A worker died on its own: schedules its restart; False when the workers keep dying."""
        now = time.monotonic()
        self._deaths.append(now)
        delay = self.policy.delay_s(self._deaths, now)
        if delay is None:
            log.error(
                "workers keep dying (%d deaths within %g s): stopping",
                self.policy.max_deaths,
                self.policy.window_s,
            )
            return False
        log.warning(
            "worker %d (pid %d) exited with status %d: restarting in %.1f s",
            worker.index,
            worker.proc.pid,
            code,
            delay,
        )
        asyncio.get_running_loop().call_later(delay, self._events.put_nowait, ("restart", worker.index))
        return True

    async def _drain(self) -> int:
        """Every worker drains (SIGTERM); a second signal is passed on; the exit status."""
        log.info("draining %d workers", len(self._alive()))
        self._signal_all()
        deadline = time.monotonic() + self.drain_timeout_s + STOP_GRACE_S
        codes = []
        while self._alive():
            try:
                event = await asyncio.wait_for(self._events.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.warning("workers still running after the drain timeout: killed")
                await self._stop(0.0)
                return 1
            if event[0] == "signal":
                self._signal_all()
            elif event[0] == "exit":
                codes.append(event[2])
        return 0 if all(c == 0 for c in codes) else 1

    def _alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.proc.returncode is None]

    def _signal_all(self) -> None:
        for w in self._alive():
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)

    async def _stop(self, kill_after_s: float) -> None:
        """Every worker still running: SIGTERM, then SIGKILL after ``kill_after_s``."""
        alive = self._alive()
        if not alive:
            return
        self._signal_all()
        try:
            await asyncio.wait_for(asyncio.gather(*(w.proc.wait() for w in alive)), kill_after_s)
        except TimeoutError:
            for w in self._alive():
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
            await asyncio.gather(*(w.proc.wait() for w in alive))
