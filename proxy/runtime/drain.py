"""Graceful shutdown: SIGTERM (or SIGINT) drains the gateway, a second one stops it at once.

On the first signal the gateway starts draining (``proxy.fleet.admission.Admission.draining``): ``/ready``
answers 503 ``draining``, so a load balancer stops sending; new generation requests get 503 ``draining``
with ``Retry-After``; the listener stays open so nobody sees a refused connection. The requests in
progress (streams included) run to their end, for at most ``drain_timeout`` seconds; then the app is
closed and ``serve`` returns 0. A second signal during the drain ends it at once (exit status 1: some
requests may have been cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from proxy.context import GATEWAY

log = logging.getLogger("kvroute.drain")
FORCED_EXIT = 1


class Signals:
    """Counts SIGINT/SIGTERM on the running loop."""

    def __init__(self) -> None:
        self.received = asyncio.Queue[int]()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # Windows event loops have no signal handlers
                loop.add_signal_handler(sig, self.received.put_nowait, sig)

    async def next(self) -> int:
        return await self.received.get()


async def drain(app: web.Application, signals: Signals, timeout_s: float) -> int:
    """Drains after the first signal (already received); the exit status."""
    admission = app[GATEWAY].admission
    admission.draining = True
    log.info("draining: %d requests in progress, up to %g s", admission.inflight, timeout_s)
    idle = asyncio.ensure_future(admission.idle.wait())
    again = asyncio.ensure_future(signals.next())
    done, pending = await asyncio.wait({idle, again}, timeout=timeout_s, return_when="FIRST_COMPLETED")
    for task in pending:
        task.cancel()
    if again in done:
        log.warning("second signal: stopping now with %d requests in progress", admission.inflight)
        return FORCED_EXIT
    if idle not in done:
        log.warning("drain timeout: stopping with %d requests in progress", admission.inflight)
    else:
        log.info("drained")
    return 0
