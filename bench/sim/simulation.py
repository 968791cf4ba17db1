"""One system on one scenario, in virtual time: the fleet, the arrivals, the requests' lives.

``simulate(scenario, jobs, system)`` runs on a fresh ``bench.sim.clock.VirtualLoop``:

1. the replicas present at the start join (each a ``SimReplica`` whose engine task starts now), and the
   scenario's fleet changes are scheduled at their times: an "add" joins a replica with empty caches, a
   "remove" drains one (the system sends it nothing new) and takes it out once its last request ended;
2. every open-loop request starts at its arrival time, every closed-loop one (a session's next turn)
   ``think_s`` after the request it follows has ended;
3. a request is routed by the system when it starts, submitted to that replica's engine at once, and
   read until its end: the ``Prefilled`` event (admitted: its cached tokens), the first ``Emitted`` (its
   first token: the system's ``first_token``), then the end of its decode (``Finished``, or ``Failed``);
   the system's ``finish`` gets what the replica reported, and the ``BalanceMeter`` every change;
4. once every request has ended the engines stop and the ``RunResult`` is assembled, replicas in spec
   order, requests in index order.

Nothing reads the wall clock, and everything iterated is ordered (lists, insertion-ordered dicts), so a
scenario and a system give the same result on every run, bit for bit.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from typing import Any

from bench.sim.balance import BalanceMeter
from bench.sim.clock import run_virtual
from bench.sim.jobs import Job
from bench.sim.replica import SimReplica, emulator_config
from bench.sim.results import ReplicaResult, RequestResult, RunResult
from bench.sim.spec import FleetChange, Scenario, SimRequest
from bench.sim.system import Outcome, Routed, System
from emulator.tickets import Emitted, Failed, Prefilled, Ticket


def simulate(scenario: Scenario, jobs: Sequence[Job], system: System) -> RunResult:
    """The run of ``system`` on ``scenario`` (module docstring); ``jobs`` from ``bench.sim.jobs``."""
    sim = Simulation(scenario, jobs, system)
    result, _ = run_virtual(sim.run())
    return result


class Simulation:
    def __init__(self, scenario: Scenario, jobs: Sequence[Job], system: System) -> None:
        self.scenario, self.jobs, self.system = scenario, {j.index: j for j in jobs}, system
        self.meter = BalanceMeter()
        self.replicas: dict[str, SimReplica] = {}
        self.routable: dict[str, None] = {}  # in the fleet and not draining, in join order
        self.inflight: dict[str, int] = defaultdict(int)
        self.routed: dict[str, int] = defaultdict(int)
        self.eligible: dict[str, int] = defaultdict(int)
        self.results: dict[int, RequestResult] = {}
        self.followers: dict[int, list[SimRequest]] = defaultdict(list)
        self._tasks: set[asyncio.Task[None]] = set()
        self._done = asyncio.Event()
        self._error: BaseException | None = None  # a request's task failed: the run stops and raises it

    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        for i, spec in enumerate(self.scenario.replicas):
            if spec.at_start:
                self._join(i)
        for change in self.scenario.changes:
            loop.call_at(change.at_s, self._change, change)
        for req in self.scenario.requests:
            if req.after is None:
                loop.call_at(req.arrival_s, self._start, req)
            else:
                self.followers[req.after].append(req)
        if self.scenario.requests:
            await self._done.wait()
        if self._error is not None:
            raise self._error
        end = loop.time()
        self.meter.close(end)
        for replica in list(self.replicas.values()):
            await replica.stop()
        return self._result(end)

    # ---- the fleet ----------------------------------------------------------------------------------
    def _join(self, index: int) -> None:
        s = self.scenario
        spec = s.replicas[index]
        cfg = emulator_config(spec, s.profile, s.seed, s.page_size, s.max_running_requests)
        replica = SimReplica(spec, cfg, index)
        replica.start()
        self.replicas[replica.id] = replica
        self.routable[replica.id] = None
        self.meter.joined(replica.id, asyncio.get_running_loop().time())
        self.system.joined(replica)

    def _change(self, change: FleetChange) -> None:
        if change.kind == "add":
            self._join(next(i for i, r in enumerate(self.scenario.replicas) if r.name == change.replica))
            return
        rid = change.replica
        self.routable.pop(rid, None)
        self.meter.left(rid, asyncio.get_running_loop().time())
        self.system.draining(rid)
        if self.inflight[rid] == 0:
            self._remove(rid)

    def _remove(self, rid: str) -> None:
        self.system.removed(rid)
        self._spawn(self.replicas.pop(rid).stop())

    # ---- requests -----------------------------------------------------------------------------------
    def _start(self, req: SimRequest) -> None:
        self._spawn(self._serve(req, asyncio.get_running_loop().time()))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._error = task.exception()
            self._done.set()

    async def _serve(self, req: SimRequest, due: float) -> None:
        job = self.jobs[req.index]
        routed = self.system.route(job, due)
        rid = routed.replica
        for r in self.routable:
            self.eligible[r] += 1
        self.routed[rid] += 1
        self.inflight[rid] += 1
        ticket = self.replicas[rid].submit(job.work)
        self.meter.arrived(rid, due)
        prefilled, first, ok = await self._until_first(ticket, routed)
        if ok:
            ok = await _until_end(ticket)
        end = asyncio.get_running_loop().time()
        self.meter.ended(rid, end, prefilled is not None)
        self._finish(req, job, routed, prefilled, first, ok, due, end)

    async def _until_first(
        self, ticket: Ticket, routed: Routed
    ) -> tuple[Prefilled | None, float | None, bool]:
        prefilled: Prefilled | None = None
        while True:
            event = await ticket.events.get()
            now = asyncio.get_running_loop().time()
            if isinstance(event, Prefilled):
                prefilled = event
                self.meter.admitted(routed.replica, now)
            elif isinstance(event, Emitted):
                self.system.first_token(routed, now)
                return prefilled, now, True
            elif isinstance(event, Failed):
                return prefilled, None, False

    def _finish(
        self,
        req: SimRequest,
        job: Job,
        routed: Routed,
        prefilled: Prefilled | None,
        first: float | None,
        ok: bool,
        due: float,
        end: float,
    ) -> None:
        cached = prefilled.cached_tokens if prefilled is not None else 0
        ttft = first - due if first is not None and ok else None
        decode = end - first if first is not None and ok else None
        completion = len(job.work.outputs[0]) if ok else 0
        outcome = Outcome(ok, job.prompt_tokens, cached, ttft, completion, decode)
        self.system.finish(routed, outcome, end)
        rid = routed.replica
        self.results[req.index] = RequestResult(req.index, req.tag, rid, due, ttft, cached, job.prompt_tokens)
        self.inflight[rid] -= 1
        if rid not in self.routable and rid in self.replicas and self.inflight[rid] == 0:
            self._remove(rid)
        loop = asyncio.get_running_loop()
        for follower in self.followers.pop(req.index, []):
            loop.call_later(follower.think_s, self._start, follower)
        if len(self.results) == len(self.scenario.requests):
            self._done.set()

    def _result(self, end: float) -> RunResult:
        replicas = tuple(
            ReplicaResult(r.name, self.routed[r.name], self.eligible[r.name],
                          self.meter.idle_while_queued.get(r.name, 0.0))
            for r in self.scenario.replicas
        )  # fmt: skip
        requests = tuple(self.results[i] for i in sorted(self.results))
        return RunResult(self.system.name, requests, replicas, end)


async def _until_end(ticket: Ticket) -> bool:
    """Waits for the decode to end (one wake-up, not one per token), then reads how it ended."""
    if ticket.decode_task is not None:
        await asyncio.wait({ticket.decode_task})
    while True:
        event = ticket.events.get_nowait() if not ticket.events.empty() else await ticket.events.get()
        if isinstance(event, Failed):
            return False
        if not isinstance(event, Emitted | Prefilled):
            return True
