"""``kvroute status --gateway URL``: the gateway's live status in the terminal (``diag/status_view.py``).

    kvroute status --gateway http://127.0.0.1:8000            redraw every 2 s until Ctrl-C
    kvroute status --gateway http://127.0.0.1:8000 --once     one snapshot, then exit

It reads the same JSON ``/status`` the status page polls. On a terminal each refresh redraws the screen
in place (cursor home + clear, plain ANSI, no curses); when stdout is not a terminal each snapshot is
printed after a blank line. A refresh that fails shows the error and the next one tries again; with
``--once`` (and for the first snapshot) a failure is the exit status: 1 when the gateway cannot be
reached or is no kvroute gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from diag.client import DiagError, SGLangClient
from diag.options import positive_float, url
from diag.status_view import render

CLEAR = "\x1b[H\x1b[2J"
TIMEOUT_S = 10.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvroute status", description=__doc__.split("\n")[0])
    p.add_argument("--gateway", type=url, required=True, help="the gateway, e.g. http://127.0.0.1:8000")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=positive_float, default=2.0, help="seconds between refreshes (2)")
    p.add_argument(
        "--key",
        default=os.environ.get("KVROUTE_STATUS_KEY"),
        help="the gateway's status or admin key, for a protected /status (default: $KVROUTE_STATUS_KEY)",
    )
    return p.parse_args(argv)


async def snapshot(client: SGLangClient) -> dict[str, Any]:
    """The gateway's /status document; DiagError when the URL is no kvroute gateway."""
    doc = await client.get_json("/status")
    if not isinstance(doc, dict) or not isinstance(doc.get("replicas"), list) or "policy" not in doc:
        raise DiagError(f"{client.url} is not a kvroute gateway (GET /status has no policy and replicas)")
    return doc


def _draw(out: TextIO, text: str, tty: bool) -> None:
    out.write((CLEAR if tty else "\n") + text + "\n")
    out.flush()


async def watch(args: argparse.Namespace, out: TextIO) -> int:
    tty = bool(getattr(out, "isatty", lambda: False)())
    async with SGLangClient(args.gateway, timeout_s=TIMEOUT_S, status_key=args.key) as client:
        last = text = render(await snapshot(client), client.url)
        if args.once:
            out.write(text + "\n")
            return 0
        while True:
            _draw(out, text, tty)
            await asyncio.sleep(args.interval)
            try:
                last = text = render(await snapshot(client), client.url)
            except DiagError as e:
                text = f"(cannot refresh: {e}; the last snapshot follows)\n{last}"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(watch(args, sys.stdout))
    except DiagError as e:
        print(f"kvroute status: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
