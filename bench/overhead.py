"""Gateway overhead: what kvroute adds to a request, next to a direct call and to sglang-router.

Method (one run, same machine, same backend):
1. One emulated SGLang replica with (almost) zero modelled latency (``--emu-time-scale 1e-6``: the
   emulator refuses 0; 40K cold tokens then "take" 15 µs), so what is measured is HTTP, proxying and
   the machine, not inference.
2. Three targets in front of it: the replica itself (``direct``), ``kvroute serve`` (a subprocess,
   policy round_robin) and ``sglang-router`` (PyPI, ``python -m sglang_router.launch_router``,
   policy round_robin, HF_HUB_OFFLINE=1).
3. Scenarios: a small non-streamed chat; a streamed chat of 64 chunks (``max_tokens=64``,
   ``ignore_eos``); a streamed chat whose request body is ~100 KB. Each at concurrency 1 and at a fixed
   higher concurrency (default 16), with bounded counts and a time cap per run. The targets take
   turns per scenario, after a warm-up.
4. Per run: end-to-end latency per request (until the last byte; for streams, the whole stream),
   time to first byte, and requests/s. "Added" = target percentile minus the direct percentile.
The load comes from one aiohttp ClientSession (TCP_NODELAY on, keep-alive pool) per run.
Results: ``bench/results/overhead/overhead.json`` and ``overhead.md``; the table is also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import orjson

from bench import systems
from bench.fleet import EmulatorFleet
from bench.procs import ManagedProcess, served_model

OUT_DIR = Path(__file__).resolve().parent / "results" / "overhead"
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


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] * 1000 if s else float("nan")


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, bool]:
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
                first, total, ok = await _one(session, url, body)
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
            _pct(x.latency, 0.5),
            _pct(x.latency, 0.99),
            _pct(x.ttfb, 0.5),
            _pct(x.ttfb, 0.99),
            len(x.latency) / x.wall if x.wall else 0.0,
        )
        for name, x in samples.items()
    ]


def targets(backend: str, with_router: bool, logs: Path) -> list[tuple[str, ManagedProcess]]:
    """kvroute (and sglang-router) in front of `backend`, both with policy round_robin, from the same
    command templates as the fleet benchmark (bench/systems.py)."""
    names = {"kvroute-round_robin": "kvroute", "sglang-round_robin": "sglang-router"}
    chosen = systems.select(list(names) if with_router else ["kvroute-round_robin"])
    return [(names[s.name], systems.system_process(s, [backend], logs / f"{s.name}.log")) for s in chosen]


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
        for name, proc in targets(fleet.urls[0], not args.no_router, logs):
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=16, help="the higher concurrency level (default 16)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request count (default 1.0)")
    p.add_argument(
        "--rounds", type=int, default=10, help="slices per scenario; targets alternate (default 10)"
    )
    p.add_argument("--no-router", action="store_true", help="skip sglang-router")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    results = asyncio.run(bench(args))
    md = table(results)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - t0, 1),
        "command": "python -m bench.overhead " + " ".join(argv or sys.argv[1:]),
    }
    (args.out / "overhead.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2)
    )
    (args.out / "overhead.md").write_text(
        f"# Gateway overhead\n\n`{meta['command']}` ({meta['cores']} cores, {meta['wall_s']} s)\n\n{md}\n"
    )
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
