"""Gateway overhead: what kvroute adds to a request, next to a direct call and to sglang-router (issue 40).

    kvroute bench overhead                         # = make bench-overhead = python -m bench.overhead
    kvroute bench overhead --no-scrape --runs 5
    kvroute bench overhead --kvroute-args "--workers 2" --label workers2 --no-scrape

Method:
1. ``--runs`` whole runs (default 3), one after the other. Each run starts a fresh emulated SGLang
   replica with (almost) zero modelled latency (``--emu-time-scale 1e-6``: the emulator refuses 0; 40K
   cold tokens then "take" microseconds), so what is measured is HTTP, proxying and the machine, not
   inference; and fresh targets in front of it: the replica itself (``direct``), ``kvroute serve`` with
   its default policy ``cost`` and any ``--kvroute-args`` (``kvroute``: the headline), the same with
   ``--policy round_robin`` (``kvroute-rr``, unless ``--no-round-robin``: the price of the cost policy),
   and ``sglang-router`` (PyPI 0.3.2, its default policy ``cache_aware``, HF_HUB_OFFLINE=1); optionally
   kvroute with ``--state`` through a Redis of its own (``--state``).
2. Cases (``cases.py``): a small non-streamed chat at concurrency 1, at ``--concurrency`` (16) and at
   ``--wide`` (128); a 64-token stream (timed to its last byte); the same ~40K-token prompt again and
   again; ~40K-token prompts that differ from their first token. Counts are bounded (times ``--scale``)
   and so is each case's wall time in each run (``--case-seconds``).
3. Within a run the targets take turns in ``--rounds`` slices of each case, in an order rotated by the
   slice and by the run, after a warm-up; the CPU time of each target's process tree is read around each
   of its slices (``cpu.py``).
4. Figures per run (``figures.py``): added p50 / p99 = the target's minus direct's; kept = req/s over
   direct's; CPU ms per request. The report gives the median over runs of each, with every run's value,
   and the issue's target beside kvroute's figures (``report.py``, ``plot.py``).
The load comes from one aiohttp ClientSession (keep-alive pool) per slice, in this process; progress
lines go to stderr. Results: ``bench/results/overhead/overhead.{json,md,png}`` (``overhead-LABEL.*`` with
``--label``); the table is also printed.

The /metrics scrape (``scrape``, also alone with ``--scrape-only``): ``kvroute serve`` (round robin) in
front of ``SCRAPE_REPLICAS`` = 16 emulated replicas with --enable-metrics and HiCache, after traffic that
gives every replica series on two routes (streamed and whole chat, streamed completions) and after the
gateway has scraped every replica once; then ``GET /metrics`` and, as the HTTP floor, ``GET /health``
take turns, ``--scrapes`` times each (default 300), one at a time on one keep-alive connection. Reported:
median and p99 of each, the ratio of the medians, the size of the exposition (bytes, samples), and the
gateway's own CPU time per GET (its ``process_cpu_seconds_total`` around ``--scrapes`` more GETs of
each): the figure that other load on the machine does not inflate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from collections.abc import Sequence
from importlib import metadata

from bench.overhead.cases import goals
from bench.overhead.figures import rows
from bench.overhead.options import parse
from bench.overhead.report import write
from bench.overhead.requests import Result, bench, say
from bench.overhead.scrape import SCRAPE_REPLICAS, scrape, write_scrape
from bench.systems.procs import NotReady
from bench.systems.registry import KVROUTE_TEMPLATE


def _meta(command: str, t0: float) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine during the run
        "command": command,
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def requests_part(args: argparse.Namespace, command: str) -> str:
    """``--runs`` whole runs, then the report; returns the markdown."""
    t0 = time.monotonic()
    runs: list[list[Result]] = []
    loads: list[dict[str, object]] = []
    for i in range(args.runs):
        say(f"overhead: run {i + 1}/{args.runs} ({time.monotonic() - t0:.0f} s so far)")
        start = round(os.getloadavg()[0], 2)
        runs.append(asyncio.run(bench(args, i)))
        loads.append(
            {"run": i + 1, "load_average_1m_start": start, "load_average_1m": round(os.getloadavg()[0], 2)}
        )
    meta = _meta(command, t0) | {
        "label": args.label,
        "kvroute": " ".join([KVROUTE_TEMPLATE % "cost", *args.kvroute_args]),
        "kvroute_args": args.kvroute_args,
        "sglang_router": _version("sglang-router"),
        "runs_done": len(runs),
        "runs": loads,
    }
    return write(args.out, meta, rows(runs, goals(args.concurrency, args.wide)), runs)


def main(argv: Sequence[str] | None = None, prog: str = "python -m bench.overhead") -> int:
    args = parse(argv, prog)
    command = shlex.join([*shlex.split(prog), *(sys.argv[1:] if argv is None else argv)])
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if not args.scrape_only:
            print(requests_part(args, command), flush=True)
        if not args.no_scrape:
            t0 = time.monotonic()
            say(f"overhead: /metrics scrape: {SCRAPE_REPLICAS} emulated replicas, {args.scrapes} scrapes ...")
            result = asyncio.run(scrape(args.scrapes, args.out / "logs"))
            print(write_scrape(args.out, _meta(command, t0), result), flush=True)
    except NotReady as exc:
        say(f"{prog}: a process did not start: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
