"""Response cache benchmark: what a hit costs, and what the cache adds to requests it does not answer.

Method (one run, same machine, one zero-latency backend, ``--emu-time-scale 1e-6``, as bench.overhead):
1. Targets side by side: the replica itself (``direct``), ``kvroute serve`` without the cache (``off``),
   with ``--response-cache memory`` and with ``--response-cache redis://...`` (a ``redis-server`` this
   benchmark starts on a free loopback port, no persistence, stopped by PID). Policy round_robin.
2. Scenarios, each a bounded count of chat requests on one keep-alive session, at concurrency 1 and a
   higher one (default 16): ``repeat``: one temperature-0 request again and again (hits on the cache
   targets after the first); ``repeat stream``: the same streamed, 64 chunks with include_usage (a hit
   is a replay); ``unique``: temperature 0, every body different (a miss and a store each); ``sampling``:
   no temperature (a bypass each). Targets take turns in slices (rotating order) after a warm-up.
3. Per run: end-to-end latency (until the last byte) p50 and p99, requests/s, errors, and the share of
   answers whose ``x-kvroute-cache`` says hit. The last column divides each target's p50 by ``off``'s.
Results: ``bench/results/response_cache/response_cache.{json,md,png}``; the table is also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.overhead.requests import pct_ms
from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import served_model
from bench.systems.redis_proc import redis_server

OUT_DIR = Path(__file__).resolve().parent / "results" / "response_cache"
RUN_TIME_CAP_S = 30.0
JSON_HEADERS = {"Content-Type": "application/json"}
Body = Callable[[int], bytes]
SCENARIOS = ("repeat", "repeat stream", "unique", "sampling")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    body: Body
    concurrency: int
    count: int


@dataclass(frozen=True, slots=True)
class Result:
    target: str
    scenario: str
    concurrency: int
    requests: int
    errors: int
    hit_share: float
    p50_ms: float
    p99_ms: float
    rps: float


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)
    hits: int = 0
    errors: int = 0
    wall: float = 0.0


def scenarios(model: str, high: int, scale: float) -> list[Scenario]:
    def chat(content: str, **fields: object) -> bytes:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        return orjson.dumps(body | fields)

    repeat = chat("Say hi.", temperature=0)
    streamed = chat(
        "Count.", temperature=0, max_tokens=64, stream=True, stream_options={"include_usage": True}
    )
    plans: list[tuple[str, Body, int]] = [
        ("repeat", lambda i: repeat, 1500),
        ("repeat stream", lambda i: streamed, 800),
        ("unique", lambda i: chat(f"Question number {i}.", temperature=0), 1500),
        ("sampling", lambda i: chat("Say hi."), 1500),
    ]

    def n(k: int) -> int:
        return max(10, int(k * scale))

    return [
        Scenario(name, body, c, n(k // (5 if c == 1 else 1))) for name, body, k in plans for c in (1, high)
    ]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, into: Samples) -> None:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=JSON_HEADERS) as r:
        async for _ in r.content.iter_any():
            pass
        into.latency.append(time.perf_counter() - t0)
        into.errors += r.status != 200
        into.hits += r.headers.get("x-kvroute-cache") == "hit"


async def run(base: str, sc: Scenario, indices: Iterator[int], count: int, into: Samples) -> None:
    """``count`` requests of ``sc`` with its concurrency on one keep-alive session; appends to ``into``."""
    url, deadline = base + "/v1/chat/completions", time.perf_counter() + RUN_TIME_CAP_S
    work = iter([next(indices) for _ in range(count)])

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in work:
            if time.perf_counter() > deadline:
                return
            try:
                await _one(session, url, sc.body(i), into)
            except aiohttp.ClientError:
                into.errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sc.concurrency)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(sc.concurrency)))
        into.wall += time.perf_counter() - t0


async def run_scenario(bases: dict[str, str], sc: Scenario, rounds: int, start: int) -> list[Result]:
    """Targets take turns in ``rounds`` slices (rotating order); every target sees the same bodies."""
    samples = {name: Samples() for name in bases}
    names = list(bases)
    per = max(1, sc.count // rounds)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            await run(
                bases[name], sc, iter(range(start + r * per, start + (r + 1) * per)), per, samples[name]
            )
    return [_result(name, sc, x) for name, x in samples.items()]


def _result(target: str, sc: Scenario, x: Samples) -> Result:
    n = len(x.latency)
    hits = x.hits / n if n else 0.0
    rps = n / x.wall if x.wall else 0.0
    return Result(
        target,
        sc.name,
        sc.concurrency,
        n,
        x.errors,
        hits,
        pct_ms(x.latency, 0.5),
        pct_ms(x.latency, 0.99),
        rps,
    )


def table(results: list[Result]) -> str:
    off = {(r.scenario, r.concurrency): r for r in results if r.target == "off"}
    lines = [
        "| scenario | conc | target | n | err | hits | p50 ms | p99 ms | req/s | p50 / off |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r.p50_ms / off[(r.scenario, r.concurrency)].p50_ms
        lines.append(
            f"| {r.scenario} | {r.concurrency} | {r.target} | {r.requests} | {r.errors} | "
            f"{r.hit_share:.0%} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.rps:.0f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def plot(path: Path, results: list[Result]) -> None:
    """Grouped bars: p50 latency per (scenario, concurrency), one bar per target (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r.scenario, r.concurrency) for r in results))
    targets = list(dict.fromkeys(r.target for r in results))
    by = {(r.scenario, r.concurrency, r.target): r.p50_ms for r in results}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(targets)
    for k, t in enumerate(targets):
        xs = [g + k * width for g in range(len(groups))]
        ax.bar(xs, [by.get((s, c, t), 0.0) for s, c in groups], width, label=t)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{s}\nc={c}" for s, c in groups])
    ax.set_yscale("log")
    ax.set_ylabel("p50 latency, ms (log)")
    ax.set_title("kvroute response cache: p50 per scenario (zero-latency emulated replica)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def bench(args: argparse.Namespace) -> list[Result]:
    emu_args = ["--emu-time-scale", "1e-6", "--max-running-requests", "256"]
    logs = args.out / "logs"
    async with EmulatorFleet(1, emu_args, logs / "emulator.log") as fleet, contextlib.AsyncExitStack() as up:
        redis_url = up.enter_context(redis_server())
        model = await served_model(fleet.urls[0]) or "default"
        bases = {"direct": fleet.urls[0]}
        for name, extra in (("off", ()), ("memory", ("memory",)), ("redis", (redis_url,))):
            flags = ("--response-cache", *extra) if extra else ()
            proc = systems.system_process(
                systems.kvroute("round_robin", *flags), fleet.urls, logs / f"{name}.log"
            )
            bases[name] = (await up.enter_async_context(proc)).urls[0]
        plan = [sc for sc in scenarios(model, args.concurrency, args.scale) if sc.name in args.scenarios]
        for base in bases.values():  # warm-up: connections, and the first (missed) answer of each repeat
            for sc in plan:
                await run(base, sc, iter(range(-10, 0)), 10, Samples())
        results: list[Result] = []
        for j, sc in enumerate(plan):
            for r in await run_scenario(bases, sc, args.rounds, start=j * 1_000_000):
                results.append(r)
                print(
                    f"  {sc.name:<14} c={sc.concurrency:<3} {r.target:<7} p50 {r.p50_ms:7.2f} ms  "
                    f"p99 {r.p99_ms:7.2f} ms  {r.rps:7.0f} req/s  hits {r.hit_share:4.0%}",
                    flush=True,
                )
        return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.response_cache", description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=16, help="the higher concurrency level (default 16)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request count (default 1.0)")
    p.add_argument("--rounds", type=int, default=5, help="slices per scenario; targets alternate (default 5)")
    p.add_argument(
        "--scenarios",
        nargs="+",
        default=list(SCENARIOS),
        choices=SCENARIOS,
        metavar="NAME",
        help=f"scenarios to run (default: all of {', '.join(SCENARIOS)})",
    )
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
        "command": "python -m bench.response_cache " + " ".join(argv or sys.argv[1:]),
    }
    doc = {"meta": meta, "results": [asdict(r) for r in results]}
    (args.out / "response_cache.json").write_text(json.dumps(doc, indent=2))
    head = f"# Response cache\n\n`{meta['command']}` ({meta['cores']} cores, {meta['wall_s']} s)\n\n"
    (args.out / "response_cache.md").write_text(head + md + "\n")
    plot(args.out / "response_cache.png", results)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
