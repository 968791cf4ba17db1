"""Command-line options shared by ``kvroute probe`` and ``kvroute ab``, validated by argparse."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from diag.client import DiagError, check_url
from diag.pressure import DEFAULT_CONTEXT_TOKENS

DEFAULT_TIMEOUT_S = 900.0  # per request: a cold 128K prefill took ~192 s in seed 2


def positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def url(text: str) -> str:
    try:
        return check_url(text)
    except DiagError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_common(p: argparse.ArgumentParser, many_urls: bool = False, context_help: str = "") -> None:
    """The shared options; with ``context_help``, ``--context-tokens`` defaults to None (the command
    sizes it) and says so, else to ``DEFAULT_CONTEXT_TOKENS``."""
    add = p.add_argument
    if many_urls:
        add("url", type=url, nargs="+", help="SGLang servers or kvroute gateways, compared side by side")
    else:
        add("url", type=url, help="an SGLang server or a kvroute gateway, e.g. http://127.0.0.1:30000")
    default = None if context_help else DEFAULT_CONTEXT_TOKENS
    add("--context-tokens", type=positive_int, default=default, help=context_help or "tokens of R (40000)")
    add("--seed", type=int, default=None, help="prompt generator seed (default: from the clock)")
    add("--max-new-tokens", type=positive_int, default=1, help="output tokens per request (1)")
    add("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, help="seconds per request (900)")
    add("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' to URL (SGLang --api-key)")
    add(
        "--status-key",
        default=os.environ.get("KVROUTE_STATUS_KEY"),
        help="a kvroute gateway's status (or admin) key, for its /status (default: $KVROUTE_STATUS_KEY)",
    )
    add("--json", action="store_true", help="print the result as JSON")
    add("--plot", type=Path, default=None, metavar="PNG", help="also write a PNG chart (needs matplotlib)")
    add("--quiet", action="store_true", help="no progress lines on stderr")


def seed_of(args: argparse.Namespace) -> int:
    """--seed, else the clock (so every run sends prompts no cache has seen)."""
    return int(args.seed) if args.seed is not None else time.time_ns() % (1 << 32)


def plotting() -> ModuleType:
    """diag.plots, imported on demand: matplotlib is an optional dependency (the bench extra)."""
    try:
        from diag import plots
    except ImportError:
        raise DiagError("--plot needs matplotlib: pip install 'kvroute[bench]'") from None
    return plots


def run_command(name: str, body: Callable[[], None]) -> int:
    """Runs a command's ``body``: exit 0, 1 with a one-line error for a DiagError, 130 on Ctrl-C."""
    try:
        body()
    except DiagError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
