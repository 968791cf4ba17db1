"""Several gateways, one view (issue 13): its three targets measured in one run, side by side.

    python -m bench.gateways            # the real settings (make bench runs it after kvroute bench)
    python -m bench.gateways --quick    # small workloads, results under /tmp/kvroute-gateways-quick

Every run below starts a FRESH emulated fleet (bench.systems.fleet.EmulatorFleet: 4 replicas, the bench's
default profile and launch flags, seed 1) on the SAME loopback ports, so a replica's id means the same
replica in every run and every run starts cold; the workloads are bench.point.prepare's (rag rescaled
to offered load 0.6 by bench.workloads.load.at_load, agent at its own pace), so every run gets the same
requests in the same order at the same arrival times (agent is closed loop: a turn is due when the previous
one finished, so its arrivals follow the system). One `redis-server` (bench.systems.redis_proc) serves the
whole benchmark; every run with shared state has a namespace of its own.

1. Agreement and TTFT, on agent and rag: (a) ONE kvroute gateway (`--policy cost`, no Redis), (b) THREE
   gateways sharing one Redis (`--state redis://... --state-namespace NS`) behind the client's round
   robin (bench.systems.gateway_pool), (a) once more. Reported: the share of requests (matched by index) that
   three gateways sent to the replica the single gateway chose (bench.reports.comparison.agreement), mean TTFT
   of each and their ratio; single vs single again is the noise floor (the emulator's timing, hence load
   and placement, differs from run to run). Targets: >= 98% agreement, mean TTFT within 5%.
2. Restarted gateway: three gateways on the rag of 1. (its 200 questions at the same arrival times)
   continued with more questions of the same seed at the same rate, RESTART_REQUESTS in all, so that
   the restarted gateway gets 50 requests after it is back; at 40% of the arrival span gateway #2
   leaves the client's rotation, gets SIGTERM and drains (kvroute finishes what it has in flight, then
   exits; SIGKILL only after DRAIN_S), is started again on its port (it replays the Redis log at start)
   and rejoins when ready.
   Reported: the hit ratio (sum cached / sum prompt tokens) of its first 50 requests after it is back
   vs the other gateways' requests over the same span. Target: within 5%.
3. Sync overhead: bench.overhead's `bench` called as a function with `--state --no-router --no-scrape`
   and a modest count: req/s of kvroute with Redis sync over kvroute alone, per scenario; the target
   (>= 0.9x) is judged on the scenarios at concurrency 16 (throughput-bound; at concurrency 1 req/s is
   the inverse of latency).

Results: bench/results/gateways/gateways.json and gateways.md (bench.reports.gateways), also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from bench.overhead import requests as overhead
from bench.overhead.options import parse as overhead_args
from bench.reports.gateways import Found, Run, write
from bench.runs.cpu import CpuMeter
from bench.runs.plan import DEFAULT_LOAD, DEFAULT_PROFILE, Point
from bench.runs.prepare import Prepared, RunSettings, prepare
from bench.runs.progress import Progress, interrupt, stage
from bench.runs.replay import replay
from bench.systems.fleet import EmulatorFleet, FleetSpec
from bench.systems.gateway_pool import GatewayPool, StateStore
from bench.systems.procs import NotReady, free_ports, served_model
from bench.systems.redis_proc import redis_server
from bench.systems.registry import kvroute
from bench.workloads import floor, load
from bench.workloads import generators as workloads

OUT_DIR = Path(__file__).resolve().parent / "results" / "gateways"
QUICK_OUT = Path("/tmp/kvroute-gateways-quick")
SEED = 1
REPLICAS = 4
GATEWAYS = 3
RESTARTED = 1  # gateway #2 (0-based)
RESTART_AT = 0.4  # of the arrival span
RESTART_REQUESTS = 600  # rag's 200 + 400 more of the same seed
MAX_RUN_S = 240.0


@dataclass(frozen=True, slots=True)
class Context:
    settings: RunSettings
    redis_url: str
    logs: Path


def settings(quick: bool, out: Path) -> RunSettings:
    fleet = FleetSpec.default(REPLICAS, quick, None, None)
    command = "python -m bench.gateways" + (" --quick" if quick else "")
    return RunSettings((kvroute("cost"),), fleet, quick, out, MAX_RUN_S, command)


def point_for(name: str) -> Point:
    load = DEFAULT_LOAD if name != "agent" else None
    return Point(DEFAULT_PROFILE, load, (SEED,), (name,))


def longer_rag(prep: Prepared, count: int, quick: bool) -> Prepared:
    """`prep`'s rag continued to `count` questions of the same seed at the same arrival rate: its first
    requests are `prep`'s at the same arrival times (bench.workloads.generators.rag's `count` extends the same
    run; rescaling the longer run to load 0.6 afresh would crowd it: its later questions are mostly
    repeats, whose floor work is small). The deadline follows bench.point.prepare's rule."""
    raw = workloads.rag(SEED, prep.fleet.shape, quick, count)
    last = len(prep.workload.requests) - 1
    factor = prep.workload.requests[last].arrival_s / raw.requests[last].arrival_s
    wl = replace(raw, requests=tuple(replace(r, arrival_s=r.arrival_s * factor) for r in raw.requests))
    ideal = floor.floor(wl, prep.fleet.page_size, prep.fleet.profile, prep.fleet.tokenizer)
    offered = load.offered(wl, ideal, prep.fleet.replicas)
    deadline = min(MAX_RUN_S, 60.0 + 4.0 * offered.span_s * prep.fleet.time_scale)
    return Prepared(wl, ideal, offered, prep.fleet, deadline)


async def run_once(
    ctx: Context,
    prep: Prepared,
    ports: list[int],
    label: str,
    n: int,
    restart_after_s: float | None = None,
    previews: bool = False,
) -> Run:
    """One configuration on a fresh fleet at `ports`: n gateways (shared state when n > 1), the replay,
    with `restart_after_s` gateway RESTARTED restarted that many wall seconds into it, and with
    `previews` every gateway's route preview of each request just before it is sent."""
    logs = ctx.logs / f"{prep.workload.name}-{label.replace(' ', '-')}"
    state = StateStore(ctx.redis_url, f"bench-{uuid.uuid4().hex[:12]}") if n > 1 else None
    progress = Progress(f"{prep.workload.name:<6} {label}", len(prep.workload.requests))
    meter, t0 = CpuMeter(), time.monotonic()
    fleet_args = prep.fleet.args(SEED)
    fleet = EmulatorFleet(prep.fleet.replicas, fleet_args, logs / "emulator.log", ports=ports)
    async with fleet, GatewayPool(n, fleet.urls, logs, state) as pool:
        model = await served_model(pool.urls[0])
        restarting = None
        if restart_after_s is not None:
            restarting = asyncio.create_task(_restart_later(pool, restart_after_s))
        scale, deadline = prep.fleet.time_scale, prep.deadline_s
        before = pool.preview if previews else None
        records = await replay(prep.workload, pool.choose, scale, deadline, progress, model, before=before)
        error = await restarting if restarting is not None else ""
    progress.close(f"restart: {error}" if error else "")
    cpu = meter.stop().foreign_cores
    wall = time.monotonic() - t0
    return Run(label, n, records, wall, cpu, pool.sends, pool.restarts, error, pool.previews)


async def _restart_later(pool: GatewayPool, delay_s: float) -> str:
    """Restarts gateway RESTARTED after `delay_s`; returns "" or what went wrong."""
    await asyncio.sleep(delay_s)
    try:
        await pool.restart(RESTARTED)
    except NotReady as exc:
        return str(exc)[:300]
    return ""


async def agreement_runs(ctx: Context, name: str) -> tuple[Prepared, list[Run]]:
    """Single, three sharing Redis, single again: on one workload, fresh fleets on the same ports."""
    prep = prepare(ctx.settings, point_for(name), name, SEED)
    ports = free_ports(prep.fleet.replicas)
    runs = [await run_once(ctx, prep, ports, "single", 1)]
    runs.append(await run_once(ctx, prep, ports, "three", GATEWAYS))
    runs.append(await run_once(ctx, prep, ports, "single again", 1))
    runs.append(await run_once(ctx, prep, ports, "three, previewed", GATEWAYS, previews=True))
    return prep, runs


async def restart_run(ctx: Context) -> tuple[Prepared, Run]:
    quick = ctx.settings.quick
    base = prepare(ctx.settings, point_for("rag"), "rag", SEED)
    prep = longer_rag(base, RESTART_REQUESTS if not quick else 240, quick)
    after = RESTART_AT * prep.offered.span_s * prep.fleet.time_scale
    ports = free_ports(prep.fleet.replicas)
    return prep, await run_once(ctx, prep, ports, "three, #2 restarted", GATEWAYS, after)


async def overhead_results(out: Path, scale: float) -> list[overhead.Result]:
    argv = ["--state", "--no-router", "--no-scrape", "--scale", f"{scale:g}", "--rounds", "6"]
    return await overhead.bench(overhead_args([*argv, "--out", str(out / "overhead")]))


async def bench(quick: bool, out: Path, overhead_scale: float) -> Found:
    agreement = {}
    with redis_server() as url:
        ctx = Context(settings(quick, out), url, out / "logs")
        for k, name in enumerate(("agent", "rag"), 1):
            stage(f"[{k}/4] agreement and TTFT on {name}: one gateway, three sharing Redis, one again")
            agreement[name] = await agreement_runs(ctx, name)
        stage("[3/4] restarted gateway: three gateways on a longer rag, #2 restarted at 40%")
        restart = await restart_run(ctx)
    stage("[4/4] sync overhead: bench.overhead --state --no-router --no-scrape")
    return Found(agreement, restart, await overhead_results(out, overhead_scale))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateways", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"small workloads (default --out {QUICK_OUT})")
    p.add_argument("--overhead-scale", type=float, default=0.5, help="bench.overhead's --scale (0.5)")
    p.add_argument("--out", type=Path, default=None, help=f"results directory (default {OUT_DIR})")
    args = p.parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else OUT_DIR)
    signal.signal(signal.SIGTERM, interrupt)
    t0 = time.monotonic()
    try:
        found = asyncio.run(bench(args.quick, out, args.overhead_scale))
    except NotReady as exc:
        print(f"bench.gateways: a process did not start: {exc}", file=sys.stderr)
        return 1
    command = shlex.join(["python", "-m", "bench.gateways", *(argv if argv is not None else sys.argv[1:])])
    print(write(out, found, command, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
