"""The gateway's self-observation, started with the app: the fleet collector and the replica scraper.

``observe_ctx`` (a cleanup_ctx, after the health poller so the first scrape finds healthy replicas)
registers ``proxy.fleet_metrics.FleetCollector`` on the gateway's registry and runs
``proxy.replica_metrics.ReplicaScraper`` as a background task at ``scrape_interval(health_interval)``;
the task is cancelled at shutdown. Requests never wait for it (``proxy/replica_metrics.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from proxy.context import GATEWAY
from proxy.fleet_metrics import FleetCollector
from proxy.replica_metrics import scrape_interval


async def observe_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    gw.metrics.watch(FleetCollector(gw.fleet, gw.router))
    scraper = gw.metrics.scraper
    scraper.set_interval(scrape_interval(gw.settings.health_interval))
    task = asyncio.get_running_loop().create_task(scraper.run(gw.up))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
