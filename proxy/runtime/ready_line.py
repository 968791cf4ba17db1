"""The ready line on stdout, ``kvroute ready URL TIMESTAMP``: printed once the gateway can serve.

Scripts, tests and the benchmark wait for this line, so it means what ``/ready`` means: at least one
replica is healthy (and, with ``--state``, the start-up replay is done). What is awaited comes from
``awaited()`` (``proxy/front/operations.py``: None once ready, else a description naming the replicas
and what they answered); a gateway started with no replica configured (``--admin-key`` alone, replicas
to be added with ``POST /admin/replicas``) has nothing to wait for and prints the line once it listens.
Until then a WARNING line says what the gateway waits for: at once, then at most every ``repeat_s``
seconds (and at once when the answer changes), so a dead backend is not a silent hang.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger("kvroute.ready")
REPEAT_S = 10.0  # at most one waiting line this often while the answer stays the same
POLL_S = 0.05  # how often readiness is looked at (a read of the fleet's state, no I/O)

Awaited = Callable[[], str | None]


def ready_line(url: str) -> str:
    return f"kvroute ready {url} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"


async def announce(url: str, awaited: Awaited, out: TextIO | None = None, repeat_s: float = REPEAT_S) -> None:
    """Prints the ready line to ``out`` (stdout) once ``awaited()`` is None; says what it waits for
    before that, at a bounded rate."""
    said, said_at = "", -repeat_s
    while (what := awaited()) is not None:
        now = time.monotonic()
        if what != said or now - said_at >= repeat_s:
            log.warning("kvroute listens on %s but is not ready: waiting for %s", url, what)
            said, said_at = what, now
        await asyncio.sleep(POLL_S)
    if said:
        log.info("ready: %s", url)
    print(ready_line(url), file=out or sys.stdout, flush=True)
