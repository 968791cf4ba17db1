"""The /metrics scrape: a gateway in front of 16 emulated replicas, ``GET /metrics`` against the HTTP floor
``GET /health``, and the gateway's own CPU time per GET (``process_cpu_seconds_total``)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import orjson

from bench.overhead.cases import chat
from bench.overhead.requests import Samples, pct_ms, run, send_one
from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import served_model

SCRAPE_REPLICAS = 16
SCRAPE_TARGET_MS = 5.0
SCRAPE_EMULATOR_ARGS = (
    "--emu-time-scale", "1e-6", "--max-running-requests", "256", "--enable-metrics", "--enable-cache-report",
    "--enable-hierarchical-cache", "--hicache-write-policy", "write_back",
)  # fmt: skip


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
            small, stream = chat(model, "Say hi.", False, 8), chat(model, "Count to 64.", True, 64)
            for body in (small, small, stream):  # whole and streamed chat, on every replica
                await run(base, functools.partial(bytes, body), 4, 4 * SCRAPE_REPLICAS, Samples())
            for _ in range(4 * SCRAPE_REPLICAS):
                await send_one(session, base + "/v1/completions", orjson.dumps(prompt))
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


def write_scrape(out: Path, meta: dict[str, object], r: ScrapeResult) -> str:
    md = scrape_table(r)
    doc = {"meta": meta, "result": asdict(r) | {"ratio": r.ratio, "target_ms": SCRAPE_TARGET_MS}}
    (out / "metrics_scrape.json").write_text(json.dumps(doc, indent=2))
    (out / "metrics_scrape.md").write_text(
        f"# /metrics scrape, {r.replicas} replicas\n\n`{meta['command']}` ({meta['cores']} cores, "
        f"load average {meta['load_average_1m']} at the end)\n\n{md}\n"
    )
    return md
