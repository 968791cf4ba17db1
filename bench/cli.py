"""`kvroute bench`: every workload against every system, each on a fresh emulated fleet.

    kvroute bench [all|WORKLOAD...] [--systems NAME,...] [--replicas 4] [--time-scale S] [--seed N] [--quick]
    kvroute bench rag --seeds 1,2,3       # each seed's results under OUT/seed-N/, their mean under OUT

For each workload, for each system: start N fresh emulated replicas (HiCache write_back, cache report,
metrics, debug endpoints), start the system from its command template (or none for client-side round
robin), wait for readiness, replay the workload with a progress bar, read each replica's request counter,
stop everything we started. Then write bench/results/<workload>/ (table.md, summary.json, records.json,
PNG plots) and the workload's block in bench/README.md. A system whose process does not come up (e.g.
a kvroute policy not implemented yet) is skipped with the reason in the table's notes.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from bench import floor, plots, report, systems, workloads
from bench.fleet import EmulatorFleet, FleetSpec, replica_counters
from bench.procs import NotReady, served_model
from bench.progress import Progress
from bench.runner import Record, replay, rotating

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class BenchConfig:
    workloads: tuple[str, ...]
    systems: tuple[systems.System, ...]
    fleet: FleetSpec
    seed: int
    quick: bool
    out_dir: Path
    readme: Path | None
    max_run_s: float
    command: str
    time_scale: float | None = None  # None: each workload's own (Workload.time_scale)
    seeds: tuple[int, ...] = ()  # several: each seed's run under out_dir/seed-N/, their mean under out_dir

    @property
    def all_seeds(self) -> tuple[int, ...]:
        return self.seeds or (self.seed,)


@dataclass(frozen=True, slots=True)
class RunResult:
    records: list[Record] | None
    per_replica: dict[str, int]
    skipped: str = ""
    model_error: float = float("nan")


async def _replay(
    cfg: BenchConfig, wl: workloads.Workload, urls: list[str], progress: Progress
) -> list[Record]:
    """Replay through one proxy URL, or rotate over the replicas' URLs (client-side round robin)."""
    model = await served_model(urls[0])
    return await replay(wl, rotating(urls), cfg.fleet.time_scale, cfg.max_run_s, progress, model)


async def run_system(cfg: BenchConfig, wl: workloads.Workload, system: systems.System) -> RunResult:
    logs = cfg.out_dir / wl.name / "logs"
    progress = Progress(f"{wl.name:<8} {system.name}", len(wl.requests))
    async with EmulatorFleet(
        cfg.fleet.replicas, cfg.fleet.args(cfg.seed), logs / f"{system.name}.emulator.log"
    ) as fleet:
        before = await replica_counters(fleet.urls)
        model_error = float("nan")
        try:
            if system.proxied:
                async with systems.system_process(system, fleet.urls, logs / f"{system.name}.log") as proc:
                    records = await _replay(cfg, wl, [proc.urls[0]], progress)
                    if system.name.startswith("kvroute-"):
                        model_error = await model_error_ratio(proc.urls[0])
            else:
                records = await _replay(cfg, wl, fleet.urls, progress)
        except NotReady as exc:
            progress.close(f"skipped: {exc}"[:300])
            return RunResult(None, {}, str(exc)[:300])
        after = await replica_counters(fleet.urls)
    progress.close()
    per_replica = {r: after.get(r, 0) - before.get(r, 0) for r in after} if after else {}
    return RunResult(records, per_replica, model_error=model_error)


async def model_error_ratio(gateway: str) -> float:
    """kvroute's cache model error over the run, from its /status: sum |predicted - reported cached|
    over sum prompt tokens, pooled over replicas (NaN when the gateway does not report it)."""
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{gateway}/status") as resp:
            status = await resp.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return float("nan")
    model = status.get("cache_model") or {}
    errors = sum(float(a.get("abs_error_tokens", 0.0)) for a in model.values())
    prompt = sum(float(a.get("prompt_tokens", 0.0)) for a in model.values())
    return errors / prompt if prompt else float("nan")


async def run_workload(cfg: BenchConfig, name: str) -> str:
    """One seed: its tables and plots under out_dir. Several: each seed's under out_dir/seed-N/, then
    the mean over seeds (``report.aggregate``) under out_dir and in the README."""
    if len(cfg.all_seeds) == 1:
        md, _ = await run_seed(replace(cfg, seed=cfg.all_seeds[0]), name)
        return md
    runs = []
    for seed in cfg.all_seeds:
        one = replace(cfg, seed=seed, seeds=(), out_dir=cfg.out_dir / f"seed-{seed}", readme=None)
        runs.append((await run_seed(one, name))[1])
    mean = report.aggregate(runs)
    wl = workloads.build(name, cfg.all_seeds[0], cfg.fleet.shape, cfg.quick)
    meta = {
        **cfg.fleet.meta(),
        "seeds": ",".join(map(str, cfg.all_seeds)),
        "quick": cfg.quick,
        "requests per seed": len(wl.requests),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    md = report.write_results(cfg.out_dir, name, meta, mean, {}, {})
    if cfg.readme is not None:
        report.update_readme(cfg.readme, cfg.command, meta, {name: md})
    print(md, file=sys.stderr)
    return md


async def run_seed(cfg: BenchConfig, name: str) -> tuple[str, list[report.Summary]]:
    """Every system on ``name`` with ``cfg.seed``; writes its results; returns (table, summaries)."""
    wl = workloads.build(name, cfg.seed, cfg.fleet.shape, cfg.quick)
    cfg = replace(cfg, fleet=replace(cfg.fleet, time_scale=cfg.time_scale or wl.time_scale))
    print(f"== {name}: {len(wl.requests)} requests, ~{wl.prompt_tokens} prompt tokens, "
          f"concurrency <= {wl.concurrency}", file=sys.stderr)  # fmt: skip
    summaries, all_records, skipped = [], {}, {}
    for system in cfg.systems:
        result = await run_system(cfg, wl, system)
        if result.records is None:
            skipped[system.name] = result.skipped
            continue
        all_records[system.name] = result.records
        summaries.append(
            report.summarize(system.name, result.records, result.per_replica, system.note, result.model_error)
        )
    summaries.append(report.floor_summary(floor.floor(wl, cfg.fleet.page_size)))
    meta = {**cfg.fleet.meta(), "seed": cfg.seed, "quick": cfg.quick, "requests": len(wl.requests),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    md = report.write_results(cfg.out_dir, name, meta, summaries, all_records, skipped)
    measured = [s for s in summaries if s.system != report.FLOOR]
    if measured:
        plots.write_all(cfg.out_dir, name, measured, all_records)
    if cfg.readme is not None:
        report.update_readme(cfg.readme, cfg.command, meta, {name: md})
    print(md, file=sys.stderr)
    return md, summaries


def parse(argv: Sequence[str]) -> BenchConfig:
    p = argparse.ArgumentParser(prog="kvroute bench", description="the fleet benchmark")
    p.add_argument(
        "workloads", nargs="*", default=["all"], help=f"all or any of {', '.join(workloads.GENERATORS)}"
    )
    p.add_argument(
        "--systems", default="", help="comma-separated names or groups (kvroute, sglang); default all"
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="wall seconds per modelled second (default: each workload's, 0.1-0.2)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--seeds",
        default="",
        help="comma-separated seeds: run each, report their mean (per-seed results under OUT/seed-N/)",
    )
    p.add_argument("--quick", action="store_true", help="a much smaller run")
    p.add_argument("--max-total-tokens", type=int, default=None, help="per-replica GPU KV pool in tokens")
    p.add_argument(
        "--max-run-seconds", type=float, default=170.0, help="wall-clock cap per workload x system"
    )
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--no-readme", action="store_true", help="do not update bench/README.md")
    a = p.parse_args(argv)
    names = list(workloads.GENERATORS) if a.workloads in ([], ["all"]) else a.workloads
    for n in names:
        if n not in workloads.GENERATORS:
            p.error(f"unknown workload {n!r}")
    fleet = FleetSpec.default(a.replicas, a.quick, a.time_scale, a.max_total_tokens)
    if a.time_scale is not None and a.time_scale <= 0:
        p.error("--time-scale must be positive")
    chosen = systems.select([s for s in a.systems.split(",") if s])
    readme = None if a.no_readme else BENCH_DIR / "README.md"
    command = shlex.join(["kvroute", "bench", *argv])
    try:
        seeds = tuple(int(s) for s in a.seeds.split(",") if s.strip())
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {a.seeds!r}")
    return BenchConfig(
        tuple(names), chosen, fleet, a.seed, a.quick, a.out, readme, a.max_run_seconds, command, a.time_scale,
        seeds,
    )  # fmt: skip


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # asyncio.run cancels the run, and every `async with` stops its process


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cfg = parse(argv)
    except ValueError as exc:
        print(f"kvroute bench: {exc}", file=sys.stderr)
        return 2
    for name in cfg.workloads:
        try:
            asyncio.run(run_workload(cfg, name))
        except NotReady as exc:
            print(f"kvroute bench: the emulated fleet did not start: {exc}", file=sys.stderr)
            return 1
    return 0
