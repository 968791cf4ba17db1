"""The request overhead: scenarios sent to each target in turns, and the latency each adds over a direct call.

``run_scenario`` lets the targets (``direct``, ``kvroute``, ``sglang-router``, optionally
``kvroute+state``) take turns in slices of every scenario, so machine noise hits all alike; ``Result``
holds one target's percentiles and rate, ``table`` the markdown with each target's added latency over
``direct``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import orjson

from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ManagedProcess, served_model
from bench.systems.redis_proc import redis_server

RUN_TIME_CAP_S = 30.0
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    body: bytes
    concurrency: int
    count: int


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


def scenarios(model: str, high: int, scale: float) -> list[Scenario]:
    def chat(content: str, stream: bool) -> bytes:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            "max_tokens": 64 if stream else 8,
            "ignore_eos": True,
        }
        return orjson.dumps(body)

    small, stream, big = (
        chat("Say hi.", False),
        chat("Count to 64.", True),
        chat("lorem ipsum " * 8_500, True),
    )

    def n(k: int) -> int:
        return max(10, int(k * scale))

    return [
        Scenario("chat small", small, 1, n(300)),
        Scenario("chat small", small, high, n(1500)),
        Scenario("stream 64 chunks", stream, 1, n(200)),
        Scenario("stream 64 chunks", stream, high, n(800)),
        Scenario("stream, 100 KB body", big, 1, n(100)),
    ]


def pct_ms(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0-1, nearest rank) of seconds ``xs``, in milliseconds (NaN when empty)."""
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] * 1000 if s else float("nan")


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=JSON_HEADERS) as r:
        ttfb = 0.0
        async for _ in r.content.iter_any():
            if not ttfb:
                ttfb = time.perf_counter() - t0
        return ttfb, time.perf_counter() - t0, r.status == 200


@dataclass
class Samples:
    latency: list[float]
    ttfb: list[float]
    errors: int = 0
    wall: float = 0.0


async def run(base: str, body: bytes, concurrency: int, count: int, into: Samples) -> None:
    """``count`` requests with ``concurrency`` workers on one keep-alive session; appends to ``into``."""
    url = base + "/v1/chat/completions"
    queue = iter(range(count))
    deadline = time.perf_counter() + RUN_TIME_CAP_S

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            if time.perf_counter() > deadline:
                return
            try:
                first, total, ok = await send_one(session, url, body)
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


async def run_scenario(bases: dict[str, str], sc: Scenario, rounds: int) -> list[Result]:
    """Targets take turns in ``rounds`` slices (rotating order), so machine noise hits all alike."""
    samples = {name: Samples([], []) for name in bases}
    names = list(bases)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            await run(bases[name], sc.body, sc.concurrency, max(1, sc.count // rounds), samples[name])
    return [
        Result(
            name,
            sc.name,
            sc.concurrency,
            len(x.latency),
            x.errors,
            pct_ms(x.latency, 0.5),
            pct_ms(x.latency, 0.99),
            pct_ms(x.ttfb, 0.5),
            pct_ms(x.ttfb, 0.99),
            len(x.latency) / x.wall if x.wall else 0.0,
        )
        for name, x in samples.items()
    ]


def targets(
    backend: str, with_router: bool, logs: Path, state: str | None = None
) -> list[tuple[str, ManagedProcess]]:
    """kvroute (and sglang-router) in front of `backend`, both with policy round_robin, from the same
    command templates as the fleet benchmark (bench/systems/registry.py); with `state`, also kvroute sharing
    its routing state through that Redis (`kvroute+state`, issue 13's sync-overhead target)."""
    names = {"kvroute-round_robin": "kvroute", "sglang-round_robin": "sglang-router"}
    chosen = systems.select(list(names) if with_router else ["kvroute-round_robin"])
    out = [(names[s.name], systems.system_process(s, [backend], logs / f"{s.name}.log")) for s in chosen]
    if state is not None:
        synced = dataclasses.replace(systems.kvroute("round_robin", "--state", state), name="kvroute-state")
        out.insert(
            1, ("kvroute+state", systems.system_process(synced, [backend], logs / "kvroute-state.log"))
        )
    return out


def table(results: list[Result]) -> str:
    direct = {(r.scenario, r.concurrency): r for r in results if r.target == "direct"}
    lines = [
        "| scenario | conc | target | n | err | p50 ms | p99 ms | added p50 ms | added p99 ms "
        "| TTFB p99 ms | req/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = direct[(r.scenario, r.concurrency)]
        added = (
            (f"{r.p50_ms - d.p50_ms:+.2f}", f"{r.p99_ms - d.p99_ms:+.2f}")
            if r.target != "direct"
            else ("", "")
        )
        lines.append(
            f"| {r.scenario} | {r.concurrency} | {r.target} | {r.requests} | {r.errors} | {r.p50_ms:.2f} | "
            f"{r.p99_ms:.2f} | {added[0]} | {added[1]} | {r.ttfb_p99_ms:.2f} | {r.rps:.0f} |"
        )
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> list[Result]:
    # the default model path (the emulator's shipped tokenizer dir): sglang-router loads its tokenizer
    emu_args = ["--emu-time-scale", "1e-6", "--max-running-requests", "256"]
    logs = args.out / "logs"
    async with EmulatorFleet(1, emu_args, logs / "emulator.log") as fleet, contextlib.AsyncExitStack() as up:
        model = await served_model(fleet.urls[0]) or "default"
        bases = {"direct": fleet.urls[0]}
        state = up.enter_context(redis_server()) if args.state else None
        for name, proc in targets(fleet.urls[0], not args.no_router, logs, state):
            bases[name] = (await up.enter_async_context(proc)).urls[0]
        plan = scenarios(model, args.concurrency, args.scale)
        for base in bases.values():  # warm-up: connections, the emulator's cache
            for sc in plan:
                await run(base, sc.body, 2, 10, Samples([], []))
        results: list[Result] = []
        for sc in plan:
            for r in await run_scenario(bases, sc, args.rounds):
                results.append(r)
                print(
                    f"  {sc.name:<20} c={sc.concurrency:<3} {r.target:<14} p50 {r.p50_ms:7.2f} ms  "
                    f"p99 {r.p99_ms:7.2f} ms  {r.rps:7.0f} req/s",
                    flush=True,
                )
        return results


def write_requests(out: Path, meta: dict[str, object], results: list[Result]) -> str:
    md = table(results)
    (out / "overhead.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2)
    )
    (out / "overhead.md").write_text(
        f"# Gateway overhead\n\n`{meta['command']}` ({meta['cores']} cores, {meta['wall_s']} s)\n\n{md}\n"
    )
    return md
