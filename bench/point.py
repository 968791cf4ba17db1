"""One workload at one point of the plan: every system on its own fresh fleet, for every seed.

For a seed: build the workload, rescale it to the point's offered load (bench/workloads/load.py; open-loop
workloads only), compute its floor, then for each system start a fresh emulated fleet on the point's
profile (with --emu-enable-faults only when the workload has outages), start the system, replay (the
outages hit the fleet's replicas during it, bench/runs/outages.py), read the replicas' counters before
and after, stop both. The
per-replica prefill seconds come from the records and the counters (bench.reports.fleet_work.replica_work).

A run during which other processes on the machine used more than FOREIGN_LIMIT cores on average
(bench/runs/cpu.py: they stretch wall time, hence modelled TTFT) is repeated once and the less disturbed of
the two kept; the table notes any run still disturbed.

Each run is bounded by a wall-clock deadline: for an open-loop workload 60 s + 4 x its arrival span in
wall seconds (an overloaded system gets time to drain, but not forever), capped by --max-run-seconds;
for a closed-loop one the cap itself.

With one seed the results go to OUT/<point dir>/<workload>/; with several, each seed's to
.../<workload>/seed-N/ (tables and JSON, no plots) and their mean (`report.aggregate`) with plots over
the pooled records to .../<workload>/.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from bench.reports import plots
from bench.reports import tables as report
from bench.reports.fleet_work import cache_loss, replica_work
from bench.runs import outages
from bench.runs.cpu import CpuMeter
from bench.runs.plan import Point
from bench.runs.prepare import Prepared, RunSettings, prepare
from bench.runs.progress import Progress
from bench.runs.replay import Record, replay, rotating
from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet, replica_counters
from bench.systems.procs import NotReady, served_model
from bench.workloads import load

FOREIGN_LIMIT = 0.4  # cores of other processes (2-core machine) above which a run is repeated once


@dataclass(frozen=True, slots=True)
class RunResult:
    records: list[Record] | None
    per_replica: dict[str, int]
    work: dict[str, float]
    skipped: str = ""
    model_error: float = float("nan")
    foreign_cpu: float = float("nan")  # cores other processes used on average during the run
    engine_loss: float = float("nan")  # bench.reports.fleet_work.cache_loss: evicted under waiting requests


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


async def _replay(prep: Prepared, urls: list[str], progress: Progress, replicas: list[str]) -> list[Record]:
    """Replay through one proxy URL, or rotate over the replicas' URLs (client-side round robin); the
    workload's outages hit `replicas` (the fleet's URLs) whatever the system."""
    model = await served_model(urls[0])
    scale = prep.fleet.time_scale
    during = outages.injector(prep.workload, replicas, scale)
    return await replay(prep.workload, rotating(urls), scale, prep.deadline_s, progress, model, during=during)


async def run_system(prep: Prepared, system: systems.System, seed: int, logs: Path) -> RunResult:
    """One run; repeated once when other processes took more than FOREIGN_LIMIT cores on average during
    it (bench/runs/cpu.py), keeping the less disturbed of the two (chosen by CPU, never by TTFT)."""
    first = await _run_once(prep, system, seed, logs)
    if not first.foreign_cpu > FOREIGN_LIMIT:
        return first
    print(f"   {system.name}: other processes used {first.foreign_cpu:.2f} cores during the run: once more",
          file=sys.stderr)  # fmt: skip
    second = await _run_once(prep, system, seed, logs)
    return min(first, second, key=lambda r: r.foreign_cpu if r.foreign_cpu == r.foreign_cpu else 0.0)


async def _run_once(prep: Prepared, system: systems.System, seed: int, logs: Path) -> RunResult:
    meter = CpuMeter()
    result = await _measure(prep, system, seed, logs)
    return replace(result, foreign_cpu=meter.stop().foreign_cores)


async def _measure(prep: Prepared, system: systems.System, seed: int, logs: Path) -> RunResult:
    progress = Progress(f"{prep.workload.name:<8} {system.name}", len(prep.workload.requests))
    fleet_args = prep.fleet.args(seed)
    async with EmulatorFleet(prep.fleet.replicas, fleet_args, logs / f"{system.name}.emulator.log") as fleet:
        before = await replica_counters(fleet.urls)
        model_error = float("nan")
        try:
            if system.proxied:
                async with systems.system_process(system, fleet.urls, logs / f"{system.name}.log") as proc:
                    records = await _replay(prep, [proc.urls[0]], progress, fleet.urls)
                    if system.name.startswith("kvroute-"):
                        model_error = await model_error_ratio(proc.urls[0])
            else:
                records = await _replay(prep, fleet.urls, progress, fleet.urls)
        except NotReady as exc:
            progress.close(f"skipped: {exc}"[:300])
            return RunResult(None, {}, {}, str(exc)[:300])
        after = await replica_counters(fleet.urls)
    progress.close()
    delta = {r: after[r] - before[r] for r in after if r in before}
    per_replica = {r: c.requests for r, c in delta.items()}
    work = replica_work(records, delta, prep.fleet.timing)
    lost = cache_loss(records, delta)
    return RunResult(records, per_replica, work, model_error=model_error, engine_loss=lost)


def caption(name: str, point: Point, seeds: Sequence[int], offered: load.OfferedLoad) -> str:
    """The line above every table: workload, profile, load (asked and offered), seeds."""
    pace = (
        f"load {point.load:g}: {offered.describe()}" if point.load is not None else "own pace (closed loop)"
    )
    plural = "s" if len(seeds) > 1 else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f"**{name}**, profile `{point.profile}`, {pace}, seed{plural} {', '.join(map(str, seeds))} ({when})"
    )


def meta(run: RunSettings, prep: Prepared, point: Point, seeds: Sequence[int]) -> dict[str, object]:
    swept = point.load is not None
    return {
        **prep.fleet.meta(),
        "load": point.load,
        "offered_load": round(prep.offered.floor, 4) if swept else None,
        "offered_load_cold": round(prep.offered.cold, 4) if swept else None,
        "offered_load_peak": round(prep.offered.peak, 4) if swept else None,
        "arrival_span_s": round(prep.offered.span_s, 2) if swept else None,
        "seeds": list(seeds),
        "quick": run.quick,
        "requests": len(prep.workload.requests),
        **({"outages": outages.describe(prep.workload)} if prep.workload.outages else {}),
        "command": run.command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


async def run_seed(
    run: RunSettings, point: Point, name: str, seed: int, target: Path, with_plots: bool
) -> tuple[list[report.Summary], dict[str, list[Record]], Prepared]:
    """Every system on `name` with `seed` at `point`; writes its results under `target`."""
    prep = prepare(run, point, name, seed)
    pace = prep.offered.describe() if point.load is not None else "own pace"
    print(f"   {name} seed {seed}: {len(prep.workload.requests)} requests, ~{prep.workload.prompt_tokens} "
          f"prompt tokens, {pace}", file=sys.stderr)  # fmt: skip
    summaries, all_records, skipped = [], {}, {}
    for system in run.systems:
        result = await run_system(prep, system, seed, target / "logs")
        if result.records is None:
            skipped[system.name] = result.skipped
            continue
        all_records[system.name] = result.records
        summaries.append(report.summarize(system.name, result.records, result.per_replica, result.work,
                                          system.note, result.model_error, result.foreign_cpu,
                                          result.engine_loss))  # fmt: skip
    summaries.append(report.floor_summary(prep.ideal))
    md = report.write_results(target, name, meta(run, prep, point, [seed]), summaries, all_records, skipped,
                              caption(name, point, [seed], prep.offered))  # fmt: skip
    if with_plots and all_records:
        plots.write_all(target, name, [s for s in summaries if s.system != report.FLOOR], all_records)
    print(md, file=sys.stderr)
    return summaries, all_records, prep


async def run_point(run: RunSettings, point: Point, name: str) -> None:
    """`name` at `point`: one seed, or each seed then their mean (module docstring)."""
    target = run.out_dir / point.directory / name
    if len(point.seeds) == 1:
        await run_seed(run, point, name, point.seeds[0], target, with_plots=True)
        return
    runs, preps = [], []
    pooled: dict[str, list[Record]] = {}
    for seed in point.seeds:
        summaries, records, prep = await run_seed(run, point, name, seed, target / f"seed-{seed}", False)
        runs.append(summaries)
        preps.append(prep)
        for system, recs in records.items():
            pooled.setdefault(system, []).extend(recs)
    mean = report.aggregate(runs)
    prep = replace(preps[0], offered=load.mean_load([p.offered for p in preps]))
    md = report.write_results(target, name, meta(run, prep, point, point.seeds), mean, {}, {},
                              caption(name, point, point.seeds, prep.offered))  # fmt: skip
    measured = [s for s in mean if s.system != report.FLOOR]
    if pooled and measured:
        plots.write_all(target, name, measured, pooled)
    print(md, file=sys.stderr)
