"""`kvroute bench sim --real`: the simulator's scenarios run for real, over HTTP, and compared.

    kvroute bench sim --real --scenarios 8 --set tuning      # the first 8 tuning scenarios
    kvroute bench sim --real --scenarios 8 --set heldout
    kvroute bench sim --real --seed 1003                     # one scenario

Per scenario: the simulator runs it with every system (``bench.sim.runner.run_scenario``); its latest
end picks the wall-clock time scale (``bench.confirm.workload.time_scale``); then each system runs it for
real on a fresh emulator fleet, one after the other (``bench.confirm.trial``), each bounded by
``--max-scenario-seconds`` / systems wall seconds. A progress line per scenario and system goes to stderr.
After every scenario ``<out>/real/<set>/comparison.{md,json,png}`` are rewritten (``bench.confirm.report``),
so a run stopped midway keeps what it measured; each system's logs are under ``<out>/real/<set>/logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench.confirm.comparison import Figures, scenario_row, set_summary
from bench.confirm.report import headline, write_reports
from bench.confirm.routers import DEFAULT_REAL_SYSTEMS, REAL_NAMES
from bench.confirm.trial import RealRun, run_trial
from bench.confirm.workload import WALL_TARGET_S, RealWorkload, time_scale, translate
from bench.sim.jobs import make_jobs
from bench.sim.results import RunResult
from bench.sim.runner import ScenarioResult, run_scenario
from bench.sim.scenarios import SETS, draw, scenario_seeds
from bench.systems.procs import NotReady

DEFAULT_OUT = Path("/tmp/kvroute-sim")
MAX_SCENARIO_S = 300.0
BUSY_RATE = 30.0  # requests per wall second above which the machine's own CPU may weigh on the figures


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute bench sim --real", description="the simulator against real runs"
    )
    add = p.add_argument
    add(
        "--set", dest="set_name", choices=sorted(SETS), default="tuning", help="the seed set (default tuning)"
    )
    add("--scenarios", type=int, default=8, help="the first N scenarios of the set (default 8)")
    add("--seed", type=int, default=None, help="run this one scenario instead of a set")
    add(
        "--systems",
        default=",".join(DEFAULT_REAL_SYSTEMS),
        help=f"comma-separated, of {', '.join(REAL_NAMES)}",
    )
    add(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"results go under OUT/real/<set> (default {DEFAULT_OUT})",
    )
    add(
        "--max-scenario-seconds",
        type=float,
        default=MAX_SCENARIO_S,
        help="wall cap of one scenario's real runs",
    )
    add("--wall-target", type=float, default=WALL_TARGET_S, help="wall seconds one system's run aims at")
    return p


def _systems(p: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    systems = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in systems if s not in REAL_NAMES]
    if unknown or "cost" not in systems or len(systems) < 2:
        p.error(f"--systems: cost and at least one of {', '.join(REAL_NAMES)}; unknown: {unknown}")
    return systems


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _sim_figures(run: RunResult) -> Figures:
    return Figures(run.mean_ttft, run.p99_ttft, run.errors, run.idle_while_queued_s)


def _real_figures(run: RealRun) -> Figures:
    return Figures(run.mean_ttft, run.p99_ttft, run.errors, run.idle_while_queued_s)


def _rate(w: RealWorkload) -> float:
    """Open-loop arrivals per wall second over their span."""
    arrivals = [r.arrival_s for r in w.requests if r.after is None]
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    return len(arrivals) / span if span > 0 else 0.0


def _notes(runs: list[RealRun], w: RealWorkload, expected_s: float, cap_s: float) -> list[str]:
    notes = [f"time scale {w.scale:g} wall s per modelled s; arrivals {_rate(w):.0f}/wall s"]
    if _rate(w) > BUSY_RATE:
        notes.append(f"arrivals above {BUSY_RATE:.0f}/wall s: the machine's CPU may weigh on the real TTFTs")
    if expected_s > cap_s:
        notes.append(f"expected {expected_s:.0f} wall s per system, over the cap {cap_s:.0f} s: cut short")
    for r in runs:
        if r.errors:
            notes.append(f"{r.system}: {r.errors} requests without a first token ({r.first_error[:100]})")
        notes += [f"{r.system}: fleet change refused: {e}" for e in r.change_errors]
    return notes


def run_one(
    seed: int, systems: tuple[str, ...], a: argparse.Namespace, logs: Path, tag: str
) -> dict[str, Any]:
    t0 = time.monotonic()
    sim = run_scenario(seed, systems)
    scenario = draw(seed)
    scale = time_scale(max(r.end_s for r in sim.runs), a.wall_target)
    workload = translate(scenario, make_jobs(scenario.requests, seed), scale)
    cap = a.max_scenario_seconds / len(systems)
    expected = max(r.end_s for r in sim.runs) * scale
    _say(
        f"{tag} {sim.description}\n        scale {scale:g}: ~{expected:.0f} wall s per system (cap {cap:.0f})"
    )
    runs = [_real(scenario, workload, name, logs / str(seed), cap, tag) for name in systems]
    done = [r for r in runs if r is not None]
    real = {r.system: _real_figures(r) for r in done}
    head = {"seed": seed, "description": sim.description, "scale": scale, "wall_s": time.monotonic() - t0}
    head["notes"] = _notes(done, workload, expected, cap) + [
        f"{n}: did not start" for n, r in zip(systems, runs, strict=True) if r is None
    ]
    return scenario_row(head, real, _sims(sim))


def _sims(sim: ScenarioResult) -> dict[str, Figures]:
    return {r.system: _sim_figures(r) for r in sim.runs}


def _real(scenario: Any, workload: Any, name: str, logs: Path, cap: float, tag: str) -> RealRun | None:
    try:
        run = asyncio.run(run_trial(scenario, workload, name, logs, cap))
    except NotReady as exc:
        _say(f"{tag}   {name}: did not start: {exc}")
        return None
    _say(f"{tag}   {name:<12} mean {run.mean_ttft:.3f} s  p99 {run.p99_ttft:.3f} s  errors {run.errors}"
         f"  idle-while-queued {run.idle_while_queued_s if run.idle_while_queued_s is not None else '-'}"
         f"  {run.wall_s:.0f} wall s")  # fmt: skip
    return run


def main(argv: list[str]) -> int:
    p = _parser()
    a = p.parse_args(argv)
    systems = _systems(p, a.systems)
    seeds = (a.seed,) if a.seed is not None else scenario_seeds(a.set_name, a.scenarios)
    name = f"seed-{a.seed}" if a.seed is not None else a.set_name
    out = a.out / "real" / name
    command = shlex.join(["kvroute", "bench", "sim", "--real", *argv])
    t0, rows = time.monotonic(), []
    for k, seed in enumerate(seeds, 1):
        row = run_one(seed, systems, a, out / "logs", f"[{k}/{len(seeds)}]")
        rows.append(row)
        _say(f"[{k}/{len(seeds)}] seed {seed}: ratio real {row['ratio_real']:.3f}, sim {row['ratio_sim']:.3f}"
             f", within 10% {row['within']}, ranked alike {row['ranked_alike']}"
             f"  ({row['wall_s']:.0f} s; {time.monotonic() - t0:.0f} s so far)")  # fmt: skip
        write_reports(out, set_summary(name, command, systems, rows))
    print("\n".join(headline(set_summary(name, command, systems, rows))))
    _say(
        f"kvroute bench sim --real: {len(seeds)} scenarios in {time.monotonic() - t0:.0f} s; reports in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
