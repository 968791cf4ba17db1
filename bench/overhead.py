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

The /metrics scrape (``scrape``, also alone with ``--scrape-only``): ``kvroute serve`` (round robin) in
front of ``SCRAPE_REPLICAS`` = 16 emulated replicas with --enable-metrics and HiCache, after traffic that
gives every replica series on two routes (streamed and whole chat, streamed completions) and after the
gateway has scraped every replica once; then ``GET /metrics`` and, as the HTTP floor, ``GET /health``
take turns, ``--scrapes`` times each (default 300), one at a time on one keep-alive connection. Reported:
median and p99 of each, the ratio of the medians, the size of the exposition (bytes, samples), and the
gateway's own CPU time per GET (its ``process_cpu_seconds_total`` around ``--scrapes`` more GETs of
each): the figure that other load on the machine does not inflate.

Results: ``bench/results/overhead/overhead.json`` and ``overhead.md``; the table is also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
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
from bench.redis_proc import redis_server

OUT_DIR = Path(__file__).resolve().parent / "results" / "overhead"
RUN_TIME_CAP_S = 30.0
JSON_HEADERS = {"Content-Type": "application/json"}
SCRAPE_REPLICAS = 16
SCRAPE_TARGET_MS = 5.0
SCRAPE_EMULATOR_ARGS = (
    "--emu-time-scale", "1e-6", "--max-running-requests", "256", "--enable-metrics", "--enable-cache-report",
    "--enable-hierarchical-cache", "--hicache-write-policy", "write_back",
)  # fmt: skip


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
    command templates as the fleet benchmark (bench/systems.py); with `state`, also kvroute sharing its
    routing state through that Redis (`kvroute+state`, issue 13's sync-overhead target)."""
    names = {"kvroute-round_robin": "kvroute", "sglang-round_robin": "sglang-router"}
    chosen = systems.select(list(names) if with_router else ["kvroute-round_robin"])
    out = [(names[s.name], systems.system_process(s, [backend], logs / f"{s.name}.log")) for s in chosen]
    if state is not None:
        synced = dataclasses.replace(systems.kvroute("round_robin", "--state", state), name="kvroute-state")
        out.insert(
            1, ("kvroute+state", systems.system_process(synced, [backend], logs / "kvroute-state.log"))
        )
    return out


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    replicas: int
    scrapes: int
    bytes: int
    samples: int
    metrics_p50_ms: float
    metrics_p99_ms: float
    health_p50_ms: float
    health_p99_ms: float
    metrics_cpu_ms: float  # the gateway's own CPU time per GET (process_cpu_seconds_total), noise-free
    health_cpu_ms: float

    @property
    def ratio(self) -> float:
        return self.metrics_p50_ms / self.health_p50_ms if self.health_p50_ms else float("nan")


async def _timed_get(session: aiohttp.ClientSession, url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    async with session.get(url) as r:
        body = await r.read()
        if r.status != 200:
            raise RuntimeError(f"GET {url} returned HTTP {r.status}")
    return time.perf_counter() - t0, body


async def _scraped_all(session: aiohttp.ClientSession, base: str, n: int) -> None:
    """Waits (at most 30 s) until the gateway has scraped every replica's own /metrics once."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        async with session.get(base + "/status") as r:
            doc = await r.json()
        if sum(1 for rep in doc["replicas"] if rep["reported"]["age_s"] is not None) == n:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not scrape every replica within 30 s")


async def _cpu_per_get(session: aiohttp.ClientSession, base: str, path: str, n: int) -> float:
    """The gateway's CPU milliseconds per ``GET path``, from its process_cpu_seconds_total around n GETs."""

    async def cpu() -> float:
        _, text = await _timed_get(session, base + "/metrics")
        line = next(x for x in text.decode().splitlines() if x.startswith("process_cpu_seconds_total "))
        return float(line.split()[1])

    before = await cpu()
    for _ in range(n):
        await _timed_get(session, base + path)
    return (await cpu() - before) / n * 1000


async def scrape(scrapes: int, logs: Path) -> ScrapeResult:
    """See the module docstring."""
    async with EmulatorFleet(SCRAPE_REPLICAS, SCRAPE_EMULATOR_ARGS, logs / "emulator-16.log") as fleet:
        (system,) = systems.select(["kvroute-round_robin"])
        proc = systems.system_process(system, fleet.urls, logs / "kvroute-16.log")
        async with proc, aiohttp.ClientSession() as session:
            base = proc.urls[0]
            model = await served_model(fleet.urls[0]) or "default"
            prompt = {"model": model, "prompt": "Count to 64.", "max_tokens": 8, "stream": True}
            for sc in scenarios(model, 4, 1.0)[:3]:  # whole and streamed chat, on every replica
                await run(base, sc.body, 4, 4 * SCRAPE_REPLICAS, Samples([], []))
            for _ in range(4 * SCRAPE_REPLICAS):
                await _one(session, base + "/v1/completions", orjson.dumps(prompt))
            await _scraped_all(session, base, SCRAPE_REPLICAS)
            timings: dict[str, list[float]] = {"/metrics": [], "/health": []}
            body = b""
            for _ in range(scrapes):
                for path, xs in timings.items():
                    took, got = await _timed_get(session, base + path)
                    xs.append(took)
                    body = got if path == "/metrics" else body
            cpu = [await _cpu_per_get(session, base, path, scrapes) for path in timings]
    text = body.decode()
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    m, h = timings["/metrics"], timings["/health"]
    latency = (pct_ms(m, 0.5), pct_ms(m, 0.99), pct_ms(h, 0.5), pct_ms(h, 0.99))
    return ScrapeResult(SCRAPE_REPLICAS, scrapes, len(body), samples, *latency, cpu[0], cpu[1])


def scrape_table(r: ScrapeResult) -> str:
    verdict, n = ("under" if r.metrics_p99_ms < SCRAPE_TARGET_MS else "OVER"), r.scrapes
    return "\n".join(
        [
            "| GET | replicas | n | p50 ms | p99 ms | gateway CPU ms per GET |",
            "|---|---|---|---|---|---|",
            f"| /metrics | {r.replicas} | {n} | {r.metrics_p50_ms:.2f} | {r.metrics_p99_ms:.2f} "
            f"| {r.metrics_cpu_ms:.2f} |",
            f"| /health (floor) | {r.replicas} | {n} | {r.health_p50_ms:.2f} | {r.health_p99_ms:.2f} "
            f"| {r.health_cpu_ms:.2f} |",
            "",
            f"/metrics: {r.bytes:,} bytes, {r.samples:,} samples; median {r.ratio:.1f}x /health's; "
            f"p99 {verdict} the {SCRAPE_TARGET_MS:.0f} ms target.",
        ]
    )


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


def _meta(argv: Sequence[str] | None, t0: float) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine during the run
        "command": "python -m bench.overhead " + " ".join(argv or sys.argv[1:]),
    }


def write_requests(out: Path, meta: dict[str, object], results: list[Result]) -> str:
    md = table(results)
    (out / "overhead.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2)
    )
    (out / "overhead.md").write_text(
        f"# Gateway overhead\n\n`{meta['command']}` ({meta['cores']} cores, {meta['wall_s']} s)\n\n{md}\n"
    )
    return md


def write_scrape(out: Path, meta: dict[str, object], r: ScrapeResult) -> str:
    md = scrape_table(r)
    doc = {"meta": meta, "result": asdict(r) | {"ratio": r.ratio, "target_ms": SCRAPE_TARGET_MS}}
    (out / "metrics_scrape.json").write_text(json.dumps(doc, indent=2))
    (out / "metrics_scrape.md").write_text(
        f"# /metrics scrape, {r.replicas} replicas\n\n`{meta['command']}` ({meta['cores']} cores, "
        f"load average {meta['load_average_1m']} at the end)\n\n{md}\n"
    )
    return md


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's settings (also what bench.gateways passes to `bench`)."""
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=16, help="the higher concurrency level (default 16)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request count (default 1.0)")
    p.add_argument(
        "--rounds", type=int, default=10, help="slices per scenario; targets alternate (default 10)"
    )
    p.add_argument("--no-router", action="store_true", help="skip sglang-router")
    p.add_argument(
        "--state", action="store_true", help="also kvroute with --state through a redis-server of its own"
    )
    p.add_argument("--scrapes", type=int, default=300, help="GET /metrics (and /health) count (300)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--scrape-only", action="store_true", help="only the /metrics scrape measurement")
    only.add_argument("--no-scrape", action="store_true", help="skip the /metrics scrape measurement")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.scrape_only:
        t0 = time.monotonic()
        results = asyncio.run(bench(args))
        print(write_requests(args.out, _meta(argv, t0), results))
    if not args.no_scrape:
        t0 = time.monotonic()
        print(
            f"  /metrics scrape: {SCRAPE_REPLICAS} emulated replicas, {args.scrapes} scrapes ...", flush=True
        )
        result = asyncio.run(scrape(args.scrapes, args.out / "logs"))
        print(write_scrape(args.out, _meta(argv, t0), result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
