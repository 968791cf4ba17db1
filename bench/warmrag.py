"""The warm-up API for RAG (issue 12): its targets measured in one run, side by side.

    python -m bench.warmrag            # the real settings (make bench runs it after bench.gateways)
    python -m bench.warmrag --quick    # small workloads, results under /tmp/kvroute-warmrag-quick

Every run starts a FRESH emulated fleet (bench.systems.fleet.EmulatorFleet: 4 write_back replicas, the bench's
default profile and launch flags, seed 1) and one `kvroute serve --policy cost` (bench.systems.registry). The
questions are bench.workloads.generators.rag's (seed 1, the document in the system message) rescaled to
offered load LOAD by bench.point.prepare, replayed by bench.runs.replay (TTFT from the scheduled
arrival).

1. warm: every rag document (1.6x the fleet's GPU pools, so some end in host memory) through
   `POST /v1/warmup` with `wait: true`, as the questions' messages start (the system message), one
   replica each; then the questions. Mean first-question TTFT over mean repeat TTFT, for all documents
   and for those the warm-up answer says sit in host memory; first questions with less than half their
   prompt cached count as cold.
2. cold: the same questions on a fresh fleet without the warm-up: first-question TTFT cold / warm.
3. throughput: on a fleet with pools big enough for them (`--max-total-tokens`), LONG_DOCS documents of
   LONG_TOKENS tokens warmed in one `wait: true` call: warmed tokens per modelled second over the
   fleet's cold prefill rate at that length (emulator/timing.py: replicas x n / prefill_seconds(0, n)).
4. live: the questions of 2. once more on a fresh fleet while a warm-up job of other documents (rag's
   documents of seed 2, `wait: false`) runs alongside: mean TTFT with / without (run 2).
5. noise: the questions of 2. once more, again without warm-up: mean TTFT of the two (what the
   emulator's run-to-run variation alone does to the ratio of 4.).

Every run's records go to OUT/records.json (not committed).

Results: bench/results/warmrag/warmrag.json and warmrag.md (bench.reports.warmrag), also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.reports import warmrag as rep
from bench.reports.comparison import mean_ttft, ratio
from bench.runs.plan import DEFAULT_PROFILE, Point
from bench.runs.prepare import Prepared, RunSettings, prepare
from bench.runs.progress import Progress, interrupt, stage
from bench.runs.replay import Record, replay
from bench.systems.fleet import EmulatorFleet, FleetSpec
from bench.systems.procs import ManagedProcess, NotReady, served_model
from bench.systems.registry import kvroute, system_process
from bench.workloads.generators import rag_documents, rag_messages
from bench.workloads.text import WordSource

OUT_DIR = Path(__file__).resolve().parent / "results" / "warmrag"
QUICK_OUT = Path("/tmp/kvroute-warmrag-quick")
SEED, OTHER_SEED, LONG_SEED = 1, 2, 3
REPLICAS = 4
LOAD = 0.3
LONG_DOCS, LONG_TOKENS = 100, 32_768
LONG_GPU_TOKENS = 300_000  # 100 x 32K over 4 replicas needs 820K of GPU + host (2x GPU) per replica
LONG_TIME_SCALE = 0.1
WARM_TIMEOUT_S = 240.0
MAX_RUN_S = 120.0
TTL_S = 900
CACHE_TOTALS = (
    "gpu_hit_tokens_total",
    "host_hit_tokens_total",
    "load_back_tokens_total",
    "evicted_tokens_total",
)
CACHE_KEYS = ("gpu_used", "host_used", *CACHE_TOTALS)


@dataclass(frozen=True, slots=True)
class Context:
    prep: Prepared
    docs: list[str]
    logs: Path
    quick: bool


def context(quick: bool, out: Path) -> Context:
    fleet = FleetSpec.default(REPLICAS, quick, None, None)
    settings = RunSettings((kvroute("cost"),), fleet, quick, out, MAX_RUN_S, "python -m bench.warmrag")
    prep = prepare(settings, Point(DEFAULT_PROFILE, LOAD, (SEED,), ("rag",)), "rag", SEED)
    return Context(prep, rag_documents(SEED, prep.fleet.shape), out / "logs", quick)


def warm_body(model: str, docs: list[str], prefix: str, wait: bool) -> dict[str, Any]:
    """A warm-up body: each document as the rag questions' messages start (the system message)."""
    documents = [
        {"id": f"{prefix}-{i}", "messages": rag_messages("system", d, "")[:1]} for i, d in enumerate(docs)
    ]
    return {"model": model, "documents": documents, "wait": wait, "ttl": TTL_S}


async def post_warmup(gateway: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """(the answer, wall seconds it took)."""
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=WARM_TIMEOUT_S)
    session = aiohttp.ClientSession(timeout=timeout)
    async with session as http, http.post(f"{gateway}/v1/warmup", json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        if resp.status >= 400:
            raise RuntimeError(f"POST /v1/warmup answered {resp.status}: {str(answer)[:300]}")
    return answer, time.monotonic() - t0


async def get_warmup(gateway: str, job: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{gateway}/v1/warmup/{job}") as resp:
        answer: dict[str, Any] = await resp.json()
    return answer


class Stack:
    """A fresh emulated fleet and one kvroute gateway in front of it (stopped by PID on exit)."""

    def __init__(self, spec: FleetSpec, logs: Path, extra: tuple[str, ...] = ()) -> None:
        self.fleet = EmulatorFleet(spec.replicas, [*spec.args(SEED), *extra], logs / "emulator.log")
        self.logs = logs
        self.gateway: ManagedProcess | None = None
        self.url = ""

    async def __aenter__(self) -> Stack:
        await self.fleet.__aenter__()
        try:
            self.gateway = system_process(kvroute("cost"), self.fleet.urls, self.logs / "gateway.log")
            await self.gateway.__aenter__()
        except BaseException:
            await asyncio.to_thread(self.fleet.close)
            raise
        self.url = self.gateway.urls[0]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.close)
        await asyncio.to_thread(self.fleet.close)


async def questions(ctx: Context, url: str, label: str) -> list[Record]:
    prep = ctx.prep
    progress = Progress(f"rag    {label}", len(prep.workload.requests))
    model = await served_model(url)
    records = await replay(
        prep.workload, lambda _r: url, prep.fleet.time_scale, prep.deadline_s, progress, model
    )
    progress.close()
    return records


async def warm_run(ctx: Context) -> tuple[list[Record], dict[str, Any], float, dict[str, Any]]:
    """(the questions' records, the warm-up answer, its wall seconds, the emulators' cache counters)."""
    async with Stack(ctx.prep.fleet, ctx.logs / "warm") as stack:
        model = await served_model(stack.url) or "default"
        view, wall = await post_warmup(stack.url, warm_body(model, ctx.docs, "doc", True))
        stage(f"   warmed {len(ctx.docs)} documents in {wall:.1f} s wall")
        before = await emu_cache(stack.fleet.urls)
        records = await questions(ctx, stack.url, "after warm-up")
        after = await emu_cache(stack.fleet.urls)
    during = {k: after.get(k, 0) - before.get(k, 0) for k in CACHE_TOTALS}
    return records, view, wall, {"after_warmup": before, "during_questions": during}


async def emu_cache(urls: list[str]) -> dict[str, int]:
    """The emulators' /_emu/state cache section summed over replicas ({} if one does not answer)."""
    out: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as http:
        for url in urls:
            async with http.get(f"{url}/_emu/state") as resp:
                cache = (await resp.json()).get("cache") or {}
            for k, v in cache.items():
                if k in CACHE_KEYS:
                    out[k] = out.get(k, 0) + int(v)
    return out


async def cold_run(ctx: Context, label: str = "no warm-up") -> list[Record]:
    async with Stack(ctx.prep.fleet, ctx.logs / label.replace(" ", "-").replace(",", "")) as stack:
        return await questions(ctx, stack.url, label)


async def live_run(ctx: Context) -> tuple[list[Record], dict[str, Any]]:
    others = rag_documents(OTHER_SEED, ctx.prep.fleet.shape)
    async with Stack(ctx.prep.fleet, ctx.logs / "live") as stack:
        model = await served_model(stack.url) or "default"
        job, _ = await post_warmup(stack.url, warm_body(model, others, "other", False))
        records = await questions(ctx, stack.url, "warm-up alongside")
        return records, await get_warmup(stack.url, job["id"])


def long_spec(ctx: Context) -> tuple[FleetSpec, int, int]:
    """The fleet, document count and tokens of the throughput run (quick: a quarter of each)."""
    count, tokens = (LONG_DOCS // 4, LONG_TOKENS // 4) if ctx.quick else (LONG_DOCS, LONG_TOKENS)
    gpu = LONG_GPU_TOKENS // 4 if ctx.quick else LONG_GPU_TOKENS
    return replace(ctx.prep.fleet, gpu_tokens=gpu, time_scale=LONG_TIME_SCALE), count, tokens


async def throughput_run(ctx: Context) -> dict[str, Any]:
    spec, count, tokens = long_spec(ctx)
    words = WordSource(LONG_SEED)
    docs = [words.document(f"Long document {i}", tokens) for i in range(count)]
    pool = ["--emu-gpu-kv-tokens", str(2 * spec.gpu_tokens)]  # above --max-total-tokens: that is the cap
    async with Stack(spec, ctx.logs / "throughput", tuple(pool)) as stack:
        model = await served_model(stack.url) or "default"
        view, wall = await post_warmup(stack.url, warm_body(model, docs, "long", True))
    warmed = [d for d in view["documents"] if d["status"] == "warm"]
    total = sum(float(d["tokens"]) for d in warmed)
    mean_n = round(total / len(warmed)) if warmed else tokens
    rate = rep.warm_rate(total, wall, spec.time_scale)
    fleet_rate = rep.prefill_rate(spec.timing, spec.replicas, mean_n)
    return {"documents": count, "warm": len(warmed), "tokens_per_document": mean_n, "wall_s": round(wall, 2),
            "gpu_tokens_per_replica": spec.gpu_tokens, "time_scale": spec.time_scale,
            "warm_tokens_per_s": rate, "fleet_prefill_tokens_per_s": fleet_rate,
            "ratio": ratio(rate, fleet_rate)}  # fmt: skip


def _first_ttft(records: list[Record]) -> float:
    return mean_ttft(r for r in records if r.tag == "first")


async def bench(quick: bool, out: Path) -> dict[str, Any]:
    ctx = context(quick, out)
    stage(f"[1/5] warm-up of {len(ctx.docs)} rag documents, then {len(ctx.prep.workload.requests)} questions")
    warm, view, warm_wall, emu = await warm_run(ctx)
    stage("[2/5] the same questions on a fresh fleet without warm-up")
    cold = await cold_run(ctx)
    stage("[3/5] warm throughput: long documents on a fleet with big pools")
    thr = await throughput_run(ctx)
    stage("[4/5] the same questions while a warm-up job of other documents runs")
    live, job = await live_run(ctx)
    stage("[5/5] the questions of 2. once more on a fresh fleet without warm-up (the noise floor)")
    again = await cold_run(ctx, "no warm-up, again")
    first = rep.first_numbers(ctx.prep.workload.requests, ctx.docs, warm, view)
    runs = {"warm": warm, "cold": cold, "live": live, "cold_again": again}
    write_records(out, runs)
    return {
        "fleet": ctx.prep.fleet.meta(), "load": LOAD, "questions": len(ctx.prep.workload.requests),
        "documents": len(ctx.docs), "warmup_wall_s": round(warm_wall, 2),
        "first_vs_repeat": first["all"], "first_vs_repeat_host": first["host"],
        "tiers_after_warmup": first["tiers_after_warmup"], "first_vs_repeat_by_tier": first["by_tier"],
        "emulator_cache": emu,
        "ideal_host_over_gpu": rep.ideal_ratio(ctx.prep.fleet.timing, warm),
        "without_vs_with": ratio(_first_ttft(cold), _first_ttft(warm)),
        "first_ttft_s": {"without": _first_ttft(cold), "with": _first_ttft(warm)},
        "throughput": thr,
        "live": rep.live_numbers(cold, live, job, again),
        "errors": {k: sum(1 for r in v if not r.ok) for k, v in runs.items()},
    }  # fmt: skip


def write_records(out: Path, runs: dict[str, list[Record]]) -> None:
    """Every run's records in OUT/records.json (not committed)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {name: [dataclasses.asdict(r) for r in records] for name, records in runs.items()}
    (out / "records.json").write_bytes(orjson.dumps(doc))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warmrag", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"small workloads (default --out {QUICK_OUT})")
    p.add_argument("--out", type=Path, default=None, help=f"results directory (default {OUT_DIR})")
    args = p.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else OUT_DIR)
    signal.signal(signal.SIGTERM, interrupt)
    t0 = time.monotonic()
    try:
        found = asyncio.run(bench(args.quick, out))
    except NotReady as exc:
        print(f"bench.warmrag: a process did not start: {exc}", file=sys.stderr)
        return 1
    command = shlex.join(["python", "-m", "bench.warmrag", *(argv if argv is not None else sys.argv[1:])])
    print(rep.write(out, found, command, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
