"""One real system on one scenario over HTTP: a fresh fleet, the router, the requests, its figures.

``run_trial`` starts the scenario's emulators (``bench.confirm.fleet``) and the system's process
(``bench.confirm.routers``; only the replicas present at the start are its backends), then replays the
scenario's requests (``bench.confirm.workload``) as the simulator does: each open-loop request at its
arrival, each closed-loop turn ``think_s`` after the answer it follows ended (whatever the outcome), with
an ``x-session-id`` header exactly where the scenario has one; the fleet changes go to the router at their
times. Each request is sent with ``bench.runs.replay.send_one`` (streamed, TTFT from when it was due, in
modelled seconds). The run is bounded by ``deadline_s`` wall seconds: requests not yet answered then
count as errors. Everything started is stopped by PID (``bench.systems.procs``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.confirm.fleet import ScenarioFleet
from bench.confirm.routers import Membership, idle_while_queued, real_system
from bench.confirm.workload import RealWorkload
from bench.runs.replay import Record, send_one
from bench.sim.results import TtftFigures
from bench.sim.spec import FleetChange, Scenario
from bench.systems.procs import free_ports
from bench.systems.registry import system_process
from bench.workloads.shapes import TimedRequest

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class RealRun(TtftFigures):
    system: str
    ttfts: tuple[float, ...]  # modelled seconds, requests that got a first token
    errors: int
    idle_while_queued_s: float | None  # modelled seconds (kvroute only)
    change_errors: tuple[str, ...]
    wall_s: float
    first_error: str = ""


class Driver:
    """Sends a workload's requests to one base URL on their schedule (module docstring)."""

    def __init__(
        self, workload: RealWorkload, base: str, on_change: Callable[[FleetChange], Awaitable[None]]
    ) -> None:
        self.w, self.base, self.on_change = workload, base, on_change
        self.records: dict[int, Record] = {}
        self._children = workload.children()
        self._tasks: set[asyncio.Task[None]] = set()
        self._t0 = 0.0

    async def run(self, http: aiohttp.ClientSession, deadline_s: float) -> None:
        self._t0 = time.perf_counter()
        for r in self.w.requests:
            if r.after is None:
                self._spawn(self._one(http, r, r.arrival_s))
        for c in self.w.changes:
            self._spawn(self._change(c))
        end = self._t0 + deadline_s
        while self._tasks and time.perf_counter() < end:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, end - time.perf_counter()))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _change(self, change: FleetChange) -> None:
        await asyncio.sleep(max(0.0, self._t0 + change.at_s - time.perf_counter()))
        await self.on_change(change)

    async def _one(self, http: aiohttp.ClientSession, req: TimedRequest, at: float) -> None:
        due = self._t0 + at
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        sticky = req.index in self.w.sticky
        rec = await send_one(http, self.base, req, self.w.scale, self._t0, sticky, None, due)
        self.records[req.index] = rec
        now = time.perf_counter() - self._t0
        for child in self._children.get(req.index, ()):
            self._spawn(self._one(http, child, now + child.think_s))


async def run_trial(
    scenario: Scenario, workload: RealWorkload, name: str, logs: Path, deadline_s: float
) -> RealRun:
    """``name`` (a simulator system name) for real on ``scenario`` (module docstring)."""
    t0 = time.monotonic()
    initial = [r.name for r in scenario.replicas if r.at_start]
    async with ScenarioFleet(scenario, workload.scale, logs) as fleet:
        port = free_ports(1)[0]
        proc = system_process(real_system(name), fleet.urls_of(initial), logs / f"{name}.log", port)
        async with proc:
            base = f"http://127.0.0.1:{port}"
            return await _drive(workload, fleet, name, base, deadline_s, t0)


async def _drive(
    w: RealWorkload, fleet: ScenarioFleet, name: str, base: str, deadline_s: float, t0: float
) -> RealRun:
    member = Membership(base, kvroute=name != "cache_aware")
    change_errors: list[str] = []
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def on_change(c: FleetChange) -> None:
            act = member.add if c.kind == "add" else member.remove
            if err := await act(http, fleet.urls[c.replica]):
                change_errors.append(f"{c.kind} {c.replica}: {err}")

        driver = Driver(w, base, on_change)
        await driver.run(http, deadline_s)
        idle = await idle_while_queued(http, base) if member.kvroute else None
    return _result(name, w, driver.records, idle, change_errors, time.monotonic() - t0)


def _result(
    name: str,
    w: RealWorkload,
    records: dict[int, Record],
    idle: float | None,
    changes: list[str],
    wall: float,
) -> RealRun:
    ok = [records[r.index] for r in w.requests if r.index in records and records[r.index].ok]
    ttfts = tuple(r.ttft_s for r in ok if r.ttft_s is not None)
    failed = [records[i].error for i in sorted(records) if not records[i].ok]
    idle_s = None if idle is None else idle / w.scale
    first = failed[0] if failed else ""
    return RealRun(name, ttfts, len(w.requests) - len(ttfts), idle_s, tuple(changes), wall, first)
