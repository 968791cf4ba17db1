"""Gateway overhead: what kvroute adds to a request, next to a direct call and to sglang-router.

Method (one run, same machine, same backend):
1. One emulated SGLang replica with (almost) zero modelled latency (``--emu-time-scale 1e-6``: the
   emulator refuses 0; 40K cold tokens then "take" 15 µs), so what is measured is HTTP, proxying and
   the machine, not inference.
2. Three targets in front of it: the replica itself (``direct``), ``kvroute serve`` (a subprocess,
   policy round_robin) and ``sglang-router`` (PyPI, ``python -m sglang_router.launch_router``,
   policy round_robin, HF_HUB_OFFLINE=1).
3. Scenarios: a small non-streamed chat; a streamed chat of 64 chunks (``max_tokens=64``,
   ``ignore_eos``); a streamed chat whose request body is ~100 KB. Each at concurrency 1 and at a fixed
   higher concurrency (default 16), with bounded counts and a time cap per run. The targets take
   turns per scenario, after a warm-up.
4. Per run: end-to-end latency per request (until the last byte; for streams, the whole stream),
   time to first byte, and requests/s. "Added" = target percentile minus the direct percentile.
The load comes from one aiohttp ClientSession (TCP_NODELAY on, keep-alive pool) per run.

The /metrics scrape (``scrape``, also alone with ``--scrape-only``): ``kvroute serve`` (round robin) in
front of ``SCRAPE_REPLICAS`` = 16 emulated replicas with --enable-metrics and HiCache, after traffic that
gives every replica series on two routes (streamed and whole chat, streamed completions) and after the
gateway has scraped every replica once; then ``GET /metrics`` and, as the HTTP floor, ``GET /health``
take turns, ``--scrapes`` times each (default 300), one at a time on one keep-alive connection. Reported:
median and p99 of each, the ratio of the medians, the size of the exposition (bytes, samples), and the
gateway's own CPU time per GET (its ``process_cpu_seconds_total`` around ``--scrapes`` more GETs of
each): the figure that other load on the machine does not inflate.

Results: ``bench/results/overhead/overhead.json`` and ``overhead.md``; the table is also printed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence

from bench.overhead.options import parse
from bench.overhead.requests import bench, write_requests
from bench.overhead.scrape import SCRAPE_REPLICAS, scrape, write_scrape


def _meta(argv: Sequence[str] | None, t0: float) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - t0, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine during the run
        "command": "python -m bench.overhead " + " ".join(argv or sys.argv[1:]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.scrape_only:
        t0 = time.monotonic()
        results = asyncio.run(bench(args))
        print(write_requests(args.out, _meta(argv, t0), results))
    if not args.no_scrape:
        t0 = time.monotonic()
        print(
            f"  /metrics scrape: {SCRAPE_REPLICAS} emulated replicas, {args.scrapes} scrapes ...", flush=True
        )
        result = asyncio.run(scrape(args.scrapes, args.out / "logs"))
        print(write_scrape(args.out, _meta(argv, t0), result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
