"""The local channel of ``--workers`` (``proxy/sync/local_hub.py`` and ``local_store.py``): a hub served on
a Unix socket in the test's temporary directory, reached by real clients. Its state store keeps the
``StateStore`` semantics (the log, documents of the others, pulses that wake readers, a worker's
documents gone with its connection); it carries the rate-limit buckets and the response cache; and two
gateway apps that share state through it route a repeated prefix to its holder, as through Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from proxy.answers.store import MemoryStore as AnswerStore
from proxy.sync.local_hub import Hub
from proxy.sync.local_store import ChannelUnavailable, LocalAnswers, LocalStore
from proxy.sync.local_wire import hub_path, hub_url
from proxy.sync.state_store import Doc
from proxy.sync.state_sync import STATE_SYNC
from proxy.tenancy.shared_limits import MemoryBuckets
from routing.sharing import Routed
from tests.conftest import Emulators, StartGateway
from tests.proxy.sync.test_state_sync import TIMEOUT, ask, gateways, replicas, settle

ROUTED = Routed("http://r1", (1, 2, 3), 16.0, 48, None)


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[tuple[Hub, str]]:
    server = Hub(MemoryBuckets(), AnswerStore(60.0, 1 << 20, 100), AnswerStore(60.0, 1 << 20, 100))
    path = str(tmp_path / "hub.sock")
    await server.start(path)
    try:
        yield server, hub_url(path)
    finally:
        await server.close()


async def test_the_url_names_the_socket() -> None:
    assert hub_path(hub_url("/tmp/x/hub.sock")) == "/tmp/x/hub.sock"
    for bad in ("redis://h:1", "kvroute+unix://host/x", "kvroute+unix://"):
        with pytest.raises(ValueError):
            hub_path(bad)


async def test_events_documents_and_leaving(hub: tuple[Hub, str]) -> None:
    _, url = hub
    a, b = LocalStore(url), LocalStore(url)
    try:
        await a.publish("ga", [ROUTED], {"load": Doc(b'{"r": [1]}', 5.0)})
        await b.publish("gb", [], {"load": Doc(b'{"r": [2]}', 5.0)})
        batches, position = await b.read("0")
        assert position == "1" and [(x.gateway, x.events) for _, x in batches] == [("ga", (ROUTED,))]
        assert (await b.read(position))[0] == []
        assert await b.gather(["load", "rates"], "gb") == {"load": {"ga": {"r": [1]}}, "rates": {}}
        await a.leave("ga", ["load"])
        assert await b.gather(["load"], "gb") == {"load": {}}
    finally:
        await a.close()
        await b.close()


async def test_a_blocking_read_wakes_on_another_workers_publish_only(hub: tuple[Hub, str]) -> None:
    _, url = hub
    a, b = LocalStore(url), LocalStore(url)
    try:
        await a.publish("ga", [], {}, pulse=False)
        await b.publish("gb", [], {}, pulse=False)
        own = asyncio.create_task(b.read("0", block_s=0.2))
        await b.publish("gb", [], {"load": Doc(b"{}", 5.0)})  # b's own pulse does not wake b
        assert (await asyncio.wait_for(own, 10))[0] == []
        waiting = asyncio.create_task(b.read("0", block_s=30.0))
        await asyncio.sleep(0.05)
        await a.publish("ga", [], {"load": Doc(b"{}", 5.0)})  # a's pulse: its documents changed
        batches, _ = await asyncio.wait_for(waiting, 10)  # long before the 30 s
        assert [(x.gateway, x.events) for _, x in batches] == [("ga", ())]
        waiting = asyncio.create_task(b.read("0", block_s=30.0))
        await a.publish("ga", [ROUTED], {})
        batches, position = await asyncio.wait_for(waiting, 10)
        assert position == "1" and batches[0][1].events == (ROUTED,)
    finally:
        await a.close()
        await b.close()


async def test_a_closed_connection_takes_its_workers_documents(hub: tuple[Hub, str]) -> None:
    server, url = hub
    a, b = LocalStore(url), LocalStore(url)
    await a.publish("ga", [], {"load": Doc(b"[1]", 60.0)})
    assert (await b.gather(["load"], "gb"))["load"] == {"ga": [1]}
    await a.close()
    for _ in range(200):
        if server.connections == 1:
            break
        await asyncio.sleep(0.01)
    assert (await b.gather(["load"], "gb"))["load"] == {}
    await b.close()


async def test_buckets_and_answers_through_the_channel(hub: tuple[Hub, str], tmp_path: Path) -> None:
    _, url = hub
    store = LocalStore(url)
    assert await store.take("t", 6, 1, 3) == (3.0, 0.0)
    granted, wait_s = await store.take("t", 6, 4, 4)
    assert granted == 0.0 and 9.9 < wait_s <= 10.0  # 3 left: a 4th in 10 s
    await store.give("t", 6, 3)
    assert await store.take("t", 6, 6, 6) == (6.0, 0.0)
    await store.close()
    answers = LocalAnswers(url, max_bytes=1000)
    assert await answers.put("kvroute:t:resp:k", b"\x00\xffbody") is True
    assert await answers.get("kvroute:t:resp:k") == b"\x00\xffbody"
    assert await answers.get("kvroute:t:resp:other") is None
    assert await answers.put("kvroute:t:resp:big", b"x" * 1000) is False  # over the bound: not sent
    await answers.close()
    gone = LocalAnswers(hub_url(str(tmp_path / "none.sock")), max_bytes=1000)
    assert await gone.get("k") is None and await gone.put("k", b"v") is False and gone.down
    await gone.close()


async def test_the_responses_space_is_apart_and_strict(hub: tuple[Hub, str], tmp_path: Path) -> None:
    """The Responses state's store in the hub: its own space (the cache's keys are not its keys), reads
    of a chain in one call with renewals, deletes; an unreachable hub raises instead of a silent miss."""
    _, url = hub
    cache, state = LocalAnswers(url, 1000), LocalAnswers(url, 1000, "responses", strict=True)
    assert await state.put("a", b"1") and await state.put("b", b"2") and await cache.put("a", b"cached")
    assert await state.get_many(["a", "x", "b"], renew=["a"]) == [b"1", None, b"2"]
    assert (await cache.get("a"), await state.get("a")) == (b"cached", b"1")
    assert await state.delete("a") is True and await state.delete("a") is False
    assert await state.get("a") is None and await cache.get("a") == b"cached"
    for s in (cache, state):
        await s.close()
    gone = LocalAnswers(hub_url(str(tmp_path / "none.sock")), 1000, "responses", strict=True)
    with pytest.raises(ChannelUnavailable):
        await gone.get("a")
    await gone.close()


async def test_two_gateways_on_the_channel_route_repeats_to_the_holder(
    hub: tuple[Hub, str], emulator_server: Emulators, gateway: StartGateway
) -> None:
    _, url = hub
    urls = await replicas(emulator_server, 3)
    a, b = await gateways(gateway, urls, 2, state=url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        first = {i: (await ask(a.url, i, s))[0] for i in range(6)}
        await settle([a, b])
        for i in range(6):
            replica, cached = await ask(b.url, i, s)
            assert replica == first[i] and cached > 0
    status = b.app[STATE_SYNC].status()
    assert status["store"] == "local" and status["state"] == "synced" and status["peers"] == 1
    assert status["applied_events"] >= 6
