"""A state store that goes away and comes back, and a gateway that starts among others (issue 42): the
sync backs off while the store is down (a few attempts a second, not one per load change), clears its
last error once the store answers, says at start what it reached and replayed, and a gateway that starts
later takes the others' token estimate instead of the default characters per token."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from proxy.sync.state_sync import RETRY_MAX_S, STATE_SYNC
from routing.config import RoutingConfig
from tests.conftest import StartGateway
from tests.proxy.conftest import Emulators, wait_for
from tests.proxy.sync.test_state_sync import TIMEOUT, ask, gateways, replicas
from tests.redis_server import RedisServer


async def test_an_outage_is_retried_with_backoff_and_its_error_cleared(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 1)
    (a,) = await gateways(gateway, urls, 1, state=redis_server.url)
    sync = a.app[STATE_SYNC]
    redis_server.stop()
    await wait_for(lambda: sync.stats.state == "degraded", 5)
    before = sync.stats.failures
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:  # load changes kick the publisher each time
        for i in range(20):
            await ask(a.url, i % 3, s)
    await asyncio.sleep(2.0)  # an outage of 2 s more, while requests keep changing the load
    per_s = (sync.stats.failures - before) / (2.0 + 0.1)
    assert per_s < 20, per_s  # was ~40 a second per gateway without a backoff
    assert sync.status()["last_error"]
    redis_server.start()
    await wait_for(lambda: sync.stats.state == "synced", RETRY_MAX_S + 5)
    assert sync.status()["last_error"] is None and sync.status()["state"] == "synced"


async def test_the_start_says_what_it_reached_and_replayed(
    redis_server: RedisServer,
    emulator_server: Emulators,
    gateway: StartGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvroute.state")
    urls = await replicas(emulator_server, 1)
    (a,) = await gateways(gateway, urls, 1, state=redis_server.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for i in range(3):
            await ask(a.url, i, s)
    await asyncio.sleep(0.3)
    await gateways(gateway, urls, 1, state=redis_server.url)
    said = [r.getMessage() for r in caplog.records if "reached" in r.getMessage()]
    assert len(said) == 2 and said[0].endswith("0 events of 0 other gateways replayed at start")
    assert "events of 1 other gateways" in said[1] and not said[1].startswith(
        f"state store {redis_server.url} reached: 0 "
    )


async def test_a_gateway_that_starts_later_takes_the_others_token_estimate(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 1)
    (a,) = await gateways(gateway, urls, 1, state=redis_server.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for i in range(6):
            await ask(a.url, i, s)
    learned = a.gw.router.tokens.bytes_per_token
    assert learned != RoutingConfig().chars_per_token and a.gw.router.tokens.samples >= 5
    (b,) = await gateways(gateway, urls, 1, state=redis_server.url)
    await wait_for(lambda: b.gw.router.tokens.bytes_per_token == pytest.approx(learned), 5)
    assert b.gw.router.tokens.samples == 0  # adopted, not learned: its own reports still count fully
