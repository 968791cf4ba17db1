"""`kvroute bench`: workloads x systems on fresh emulated fleets, at points of a plan (bench/runs/plan.py).

    kvroute bench                     # the default plan (make bench): loads 0.3/0.6/0.9, two profiles
    kvroute bench --matrix            # every workload x every system, seeds' profile, load 0.6, seed 1
    kvroute bench rag hot --load 0.3,0.9 --profile h200 --seeds 1,2 --systems kvroute-cost,oracle
    kvroute bench rag --quick         # small and fast; writes under a temporary directory
    kvroute bench sim --scenarios 10  # the fleet simulator in virtual time (bench/sim/cli.py)
    kvroute bench sim --real --seed 1003  # the simulator confirmed on real runs (bench/confirm/cli.py)
    kvroute bench overhead            # the gateway's own cost vs direct and sglang-router (bench/overhead)

For each point, workload, seed and system: build the workload (seeded) and rescale its arrivals to the
point's offered load (bench/workloads/load.py), start N fresh emulated replicas on the point's profile
(HiCache write_back, cache report, metrics, debug endpoints), start the system from its command template (none
for client-side round robin), wait until it is ready, replay the workload with a progress bar, read each
replica's counters, stop everything we started. Each (point, workload) writes
OUT/<profile>/<load-dir>/<workload>/ (table.md, summary.json, records.json, PNG plots; with several
seeds each one's under seed-N/ and their mean above), then the run rewrites the cross-point summary, the
per-workload plots of TTFT against load and the fleet section of bench/README.md (bench/reports/summary.py)
from every result under OUT. A system whose process does not come up is skipped with the reason.
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

from bench.point import run_point
from bench.reports.summary import write_summary
from bench.runs import plan
from bench.runs.plan import Point
from bench.runs.prepare import RunSettings
from bench.runs.progress import interrupt
from bench.systems import registry as systems
from bench.systems.fleet import FleetSpec
from bench.systems.procs import NotReady
from bench.workloads import generators as workloads

BENCH_DIR = Path(__file__).resolve().parent
QUICK_OUT = Path("/tmp/kvroute-bench-quick")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    points: tuple[Point, ...]
    run: RunSettings
    readme: Path | None


def _floats(text: str, flag: str, p: argparse.ArgumentParser) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag}: expected comma-separated numbers, got {text!r}")
    if not values or any(not v > 0 for v in values):
        p.error(f"{flag}: expected positive numbers, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvroute bench", description="the fleet benchmark")
    add = p.add_argument
    add(
        "workloads",
        nargs="*",
        default=[],
        help=f"any of {', '.join(workloads.GENERATORS)} (default: the plan)",
    )
    add("--matrix", action="store_true", help="every workload x every system at load 0.6, one seed")
    add("--load", default="", help=f"offered loads, comma-separated (default {plan.DEFAULT_LOAD})")
    add("--profile", default="", help="emulator profiles, comma-separated (default rtx3090x2)")
    add(
        "--seeds",
        type=plan.seeds_arg,
        default=(),
        help="comma-separated seeds: the table is their mean (default 1)",
    )
    add("--systems", default="", help="comma-separated names or groups (kvroute, sglang, all)")
    add("--replicas", type=int, default=4)
    add("--time-scale", type=float, default=None, help="wall s per modelled s (default: the workload's)")
    add("--quick", action="store_true", help=f"a much smaller run (default --out {QUICK_OUT}, no README)")
    add("--max-total-tokens", type=int, default=None, help="per-replica GPU KV pool in tokens")
    add("--max-run-seconds", type=float, default=240.0, help="wall-clock cap per workload x system")
    add("--out", type=Path, default=None, help="results directory (default bench/results)")
    add("--no-readme", action="store_true", help="do not update bench/README.md")
    return p


def _points(a: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[Point, ...]:
    for name in a.workloads:
        if name not in workloads.GENERATORS:
            p.error(f"unknown workload {name!r}; known: {', '.join(workloads.GENERATORS)}")
    profiles = [x.strip() for x in a.profile.split(",") if x.strip()] or [plan.DEFAULT_PROFILE]
    for name in profiles:
        if name not in plan.PROFILES:
            p.error(f"unknown profile {name!r}; known: {', '.join(plan.PROFILES)}")
    seeds = list(a.seeds) or [1]
    if a.matrix:
        return plan.matrix_plan(seeds[0])
    if not (a.workloads or a.load or a.profile or a.seeds):
        return plan.default_plan()
    loads = _floats(a.load, "--load", p) if a.load else [plan.DEFAULT_LOAD]
    return plan.custom(a.workloads or list(workloads.GENERATORS), loads, profiles, seeds)


def parse(argv: Sequence[str]) -> BenchConfig:
    p = _parser()
    a = p.parse_args(argv)
    if a.time_scale is not None and a.time_scale <= 0:
        p.error("--time-scale must be positive")
    points = _points(a, p)
    names = [s for s in a.systems.split(",") if s]
    if names == ["all"] or (a.matrix and not names):
        chosen = systems.default_systems()
    else:
        chosen = systems.select(names or list(plan.SWEEP_SYSTEMS))
    out = a.out or (QUICK_OUT if a.quick else BENCH_DIR / "results")
    # bench/README.md summarises bench/results only: a quick run or results elsewhere leave it alone
    in_results = Path(out).resolve() == (BENCH_DIR / "results").resolve()
    readme = BENCH_DIR / "README.md" if in_results and not (a.no_readme or a.quick) else None
    fleet = FleetSpec.default(a.replicas, a.quick, a.time_scale, a.max_total_tokens)
    command = shlex.join(["kvroute", "bench", *argv])
    run = RunSettings(chosen, fleet, a.quick, out, a.max_run_seconds, command, a.time_scale)
    return BenchConfig(points, run, readme)


def main(argv: list[str]) -> int:
    if argv[:1] == ["sim"] and "--real" in argv:
        from bench.confirm.cli import main as confirm_main

        return confirm_main([x for x in argv[1:] if x != "--real"])
    if argv[:1] == ["sim"]:
        from bench.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv[:1] == ["overhead"]:
        from bench.overhead.__main__ import main as overhead_main

        return overhead_main(argv[1:], prog="kvroute bench overhead")
    signal.signal(signal.SIGTERM, interrupt)
    try:
        cfg = parse(argv)
    except ValueError as exc:
        print(f"kvroute bench: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    total = sum(len(p.workloads) for p in cfg.points)
    done = 0
    for point in cfg.points:
        for name in point.workloads:
            done += 1
            elapsed = time.monotonic() - t0
            print(f"== [{done}/{total}] {name}, {point.describe()} ({elapsed / 60:.1f} min so far)",
                  file=sys.stderr)  # fmt: skip
            try:
                asyncio.run(run_point(cfg.run, replace(point, workloads=(name,)), name))
            except NotReady as exc:
                print(f"kvroute bench: the emulated fleet did not start: {exc}", file=sys.stderr)
                return 1
    write_summary(cfg.run.out_dir, cfg.readme, cfg.run.command, time.monotonic() - t0)
    print(f"kvroute bench: done in {(time.monotonic() - t0) / 60:.1f} min", file=sys.stderr)
    return 0
