"""The warm-up worker stops when cancelled, even when woken at that moment.

On Python 3.11 ``asyncio.wait_for`` returns the inner result when the wait it guards completes in the
same loop iteration as the cancel, and the cancel is lost: a loop around it never ends, and the app's
cleanup waits for it forever (a gateway's teardown hung for 120 s with a warm-up finishing). The
state-sync loops guard against it with ``_stop_if_asked``."""

from __future__ import annotations

import asyncio

from proxy.config.settings import Settings
from proxy.server import build_app as build_gateway
from proxy.warm.api import WARMUPS


async def test_the_warmup_worker_stops_when_woken_as_it_is_cancelled() -> None:
    jobs = build_gateway(Settings(backends=("http://127.0.0.1:9",)))[WARMUPS]
    task = asyncio.get_running_loop().create_task(jobs.run())
    await asyncio.sleep(0.05)  # waiting for its wake-up now
    jobs._wake.set()
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 2.0)
    assert task.cancelled()
