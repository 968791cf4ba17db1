"""The command line of ``python -m bench.overhead`` (also what ``bench.gateways`` passes to ``bench``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "overhead"
DESCRIPTION = "Gateway overhead: what kvroute adds to a request, next to a direct call and to sglang-router."


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's settings (also what bench.gateways passes to `bench`)."""
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=DESCRIPTION)
    p.add_argument("--concurrency", type=int, default=16, help="the higher concurrency level (default 16)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request count (default 1.0)")
    p.add_argument(
        "--rounds", type=int, default=10, help="slices per scenario; targets alternate (default 10)"
    )
    p.add_argument("--no-router", action="store_true", help="skip sglang-router")
    p.add_argument(
        "--state", action="store_true", help="also kvroute with --state through a redis-server of its own"
    )
    p.add_argument("--scrapes", type=int, default=300, help="GET /metrics (and /health) count (300)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--scrape-only", action="store_true", help="only the /metrics scrape measurement")
    only.add_argument("--no-scrape", action="store_true", help="skip the /metrics scrape measurement")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    return p.parse_args(argv)
