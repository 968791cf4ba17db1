"""``python -m bench.labs.faults``: the fault-injection suite at a larger count, as a table.

Runs the ten kinds of ``bench.labs.fault_lab`` (each on a fresh gateway over the same emulated fleet and
Redis), ``--requests`` each (default 500, every other one streamed) at ``--concurrency`` (default 16),
prints one row per kind (requests, failures before the first byte, stream errors, lost, retries, what
the gateway met: upstream errors and breaker trips, and the slowest request, sent to answered) and
writes the table to ``bench/results/faults.md``. About 20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.labs.fault_lab import KINDS, FaultLab, Tally, run_kind

OUT = Path(__file__).parents[1] / "results" / "faults.md"
HEADER = (
    "| kind | requests | failed before first byte | stream errors | lost | retries | upstream errors "
    "| breaker trips | slowest s |\n|---|---|---|---|---|---|---|---|---|"
)


def row(t: Tally) -> str:
    cells = (
        t.kind,
        t.requests,
        t.failed_early,
        t.stream_errors,
        t.lost,
        t.retries,
        t.upstream_errors,
        t.trips,
        f"{t.slowest_s:.2f}",
    )
    return "| " + " | ".join(str(c) for c in cells) + " |"


async def run(lab: FaultLab, kinds: Sequence[str], n: int, concurrency: int) -> list[Tally]:
    tallies = []
    for kind in kinds:
        t = await run_kind(lab, kind, n, concurrency)
        print(f"  {row(t)}", flush=True)
        tallies.append(t)
    return tallies


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.labs.faults", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=500, help="requests per fault kind (default 500)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, metavar="KIND")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    t0 = time.monotonic()
    with FaultLab() as lab:
        tallies = asyncio.run(run(lab, args.kinds, args.requests, args.concurrency))
    wall = time.monotonic() - t0
    command = "python -m bench.labs.faults " + " ".join(argv if argv is not None else sys.argv[1:])
    table = "\n".join([HEADER, *(row(t) for t in tallies)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    head = f"# Faults\n\n`{command.strip()}` ({os.cpu_count()} cores, {wall:.1f} s)\n\n"
    args.out.write_text(head + table + "\n")
    print(table)
    lost = sum(t.lost + t.failed_early for t in tallies)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
