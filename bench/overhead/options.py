"""The command line of ``kvroute bench overhead`` / ``python -m bench.overhead`` (also what ``bench.gateways``
passes to ``requests.bench``)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "overhead"
DESCRIPTION = "Gateway overhead: what kvroute adds to a request, next to a direct call and to sglang-router."


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _label(text: str) -> str:
    if not all(ch.isalnum() or ch in "-_." for ch in text):
        raise argparse.ArgumentTypeError(f"a label is letters, digits, '-', '_' or '.', got {text!r}")
    return text


def parser(prog: str = "python -m bench.overhead") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add = p.add_argument
    add(
        "--runs", type=_positive_int, default=3, help="whole alternating runs; the report is their median (3)"
    )
    add("--concurrency", type=_positive_int, default=16, help="the higher concurrency level (default 16)")
    add("--wide", type=_positive_int, default=128, help="the widest concurrency level (default 128)")
    add("--scale", type=_positive_float, default=1.0, help="multiply every request count (default 1.0)")
    add("--rounds", type=_positive_int, default=10, help="slices per case; targets alternate (default 10)")
    add("--case-seconds", type=_positive_float, default=30.0,
        help="wall-clock budget of one case in one run, all targets together (default 30)")  # fmt: skip
    add("--no-router", action="store_true", help="skip sglang-router")
    add("--no-round-robin", action="store_true", help="skip kvroute with --policy round_robin (kvroute-rr)")
    add("--state", action="store_true", help="also kvroute with --state through a redis-server of its own")
    add("--kvroute-args", type=shlex.split, default=[], metavar="ARGS",
        help="more flags for every kvroute serve command line: --kvroute-args=\"--workers 2\"")  # fmt: skip
    add("--label", type=_label, default="",
        help="names the kvroute configuration; results go to overhead-LABEL.{json,md,png}")  # fmt: skip
    add("--scrapes", type=_positive_int, default=300, help="GET /metrics (and /health) count (300)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--scrape-only", action="store_true", help="only the /metrics scrape measurement")
    only.add_argument("--no-scrape", action="store_true", help="skip the /metrics scrape measurement")
    add("--out", type=Path, default=OUT_DIR)
    return p


def parse(argv: Sequence[str] | None = None, prog: str = "python -m bench.overhead") -> argparse.Namespace:
    """The command line's settings (also what bench.gateways passes to `requests.bench`)."""
    return parser(prog).parse_args(argv)
