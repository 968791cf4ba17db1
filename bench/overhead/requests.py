"""One whole run of the request overhead: a fresh zero-latency replica, the targets in front, every case.

``bench(args, index)`` starts one emulated replica (``--emu-time-scale 1e-6``) and the targets: the
replica itself (``direct``), ``kvroute serve`` with its default policy ``cost`` (``kvroute``) and with
``--policy round_robin`` (``kvroute-rr``, unless ``--no-round-robin``), optionally with ``--state``
through a Redis of its own (``kvroute+state``), and ``sglang-router`` with its default policy
``cache_aware``; ``--kvroute-args`` go on every kvroute command line. After a warm-up, ``run_case`` lets
the targets take turns in ``rounds`` slices of each case, in an order rotated by the slice and the run,
so machine noise hits all alike. Every slice is timed (end-to-end latency until the last byte, time to
first byte, wall time) and the target's process tree's CPU time is read around it
(``cpu.tree_cpu_s``; for ``direct``, the replica's). A case's slices share a wall-clock budget
(``--case-seconds``): a slice may use what is left over the rounds left (so a slow target gets the time
the fast ones did not need) and starts no request after that. ``Result`` is one target's figures in one
case of one run. ``bench.gateways`` calls ``bench`` too (one run, ``--state --no-router``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.overhead.cases import Body, Case, cases
from bench.overhead.cpu import tree_cpu_s
from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ManagedProcess, served_model
from bench.systems.redis_proc import redis_server

JSON_HEADERS = {"Content-Type": "application/json"}
EMULATOR_ARGS = ("--emu-time-scale", "1e-6", "--max-running-requests", "256")
NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Result:
    target: str
    scenario: str
    concurrency: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    rps: float
    cpu_ms: float = NAN  # CPU ms per request of the target's process tree (direct: the replica's)


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    errors: int = 0
    wall: float = 0.0
    cpu_s: float = 0.0


def pct_ms(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0-1, nearest rank) of seconds ``xs``, in milliseconds (NaN when empty)."""
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] * 1000 if s else NAN


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=JSON_HEADERS) as r:
        ttfb = 0.0
        async for _ in r.content.iter_any():
            if not ttfb:
                ttfb = time.perf_counter() - t0
        return ttfb, time.perf_counter() - t0, r.status == 200


async def run(
    base: str, body: Body, concurrency: int, count: int, into: Samples, cap_s: float = 30.0
) -> None:
    """``count`` requests with ``concurrency`` workers on one keep-alive session, none started after
    ``cap_s`` seconds; appends to ``into``."""
    url, queue = base + "/v1/chat/completions", iter(range(count))
    deadline = time.perf_counter() + cap_s

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            if time.perf_counter() > deadline:
                return
            payload = body()
            try:
                first, total, ok = await send_one(session, url, payload)
            except aiohttp.ClientError:
                into.errors += 1
                continue
            into.errors += not ok
            into.latency.append(total)
            into.ttfb.append(first)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        into.wall += time.perf_counter() - t0


def result(name: str, case: Case, x: Samples) -> Result:
    n = len(x.latency)
    lat = (pct_ms(x.latency, 0.5), pct_ms(x.latency, 0.99), pct_ms(x.ttfb, 0.5), pct_ms(x.ttfb, 0.99))
    rps = n / x.wall if x.wall else 0.0
    return Result(name, case.name, case.concurrency, n, x.errors, *lat, rps, x.cpu_s * 1000 / n if n else NAN)


async def run_case(
    bases: dict[str, str], pids: dict[str, int], case: Case, rounds: int, turn: int, budget_s: float
) -> list[Result]:
    """Targets take turns in ``rounds`` slices (order rotated by slice and ``turn``) within ``budget_s``."""
    samples = {name: Samples() for name in bases}
    names, per = list(bases), max(1, case.count // rounds)
    end = time.perf_counter() + budget_s
    for r in range(rounds):
        k = (turn + r) % len(names)
        for name in names[k:] + names[:k]:
            cap = max(0.0, end - time.perf_counter()) / (rounds - r)
            before = tree_cpu_s(pids[name])
            await run(bases[name], case.body, case.concurrency, per, samples[name], cap)
            samples[name].cpu_s += tree_cpu_s(pids[name]) - before
    return [result(name, case, x) for name, x in samples.items()]


def targets(
    backend: str, args: argparse.Namespace, logs: Path, state: str | None
) -> list[tuple[str, ManagedProcess]]:
    """The routers in front of ``backend``, from bench/systems/registry.py's command templates."""
    extra = list(args.kvroute_args)
    chosen = [("kvroute", systems.kvroute("cost", *extra))]
    if not args.no_round_robin:
        chosen.append(("kvroute-rr", systems.kvroute("round_robin", *extra)))
    if state is not None:
        synced = systems.kvroute("cost", *extra, "--state", state)
        chosen.append(("kvroute+state", dataclasses.replace(synced, name="kvroute-state")))
    if not args.no_router:
        (router,) = systems.select(["sglang-cache_aware"])
        chosen.append(("sglang-router", router))
    return [(name, systems.system_process(s, [backend], logs / f"{s.name}.log")) for name, s in chosen]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def bench(args: argparse.Namespace, index: int = 0) -> list[Result]:
    """One whole run (see the module docstring); ``index`` rotates the targets' order."""
    logs = args.out / "logs"
    async with (
        EmulatorFleet(1, EMULATOR_ARGS, logs / "emulator.log") as fleet,
        contextlib.AsyncExitStack() as up,
    ):
        model = await served_model(fleet.urls[0]) or "default"
        bases, pids = {"direct": fleet.urls[0]}, {"direct": fleet.pid or 0}
        state = up.enter_context(redis_server()) if args.state else None
        for name, proc in targets(fleet.urls[0], args, logs, state):
            bases[name], pids[name] = (await up.enter_async_context(proc)).urls[0], proc.pid or 0
        plan = cases(model, args.concurrency, args.wide, args.scale)
        for base in bases.values():  # warm-up: connections (as many as each case opens), caches
            for case in plan:
                await run(base, case.body, case.concurrency, max(8, 2 * case.concurrency), Samples())
        results: list[Result] = []
        for case in plan:
            for r in await run_case(bases, pids, case, args.rounds, index, args.case_seconds):
                results.append(r)
                say(f"  {case.name:<28} c={case.concurrency:<3} {r.target:<14} n {r.requests:5}  "
                    f"p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  {r.rps:6.0f} req/s  "
                    f"CPU {r.cpu_ms:5.2f} ms/req")  # fmt: skip
        return results
