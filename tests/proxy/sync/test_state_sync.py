"""Several gateways, one view (issue 13): gateways sharing routing state through a real ``redis-server``
that the tests start on a free port (and kill, restart and flush), or through one in-process store.

Each test drives the gateways with plain HTTP over the real emulator; a request's replica is read from
``x-kvroute-replica``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from bench.systems.procs import free_ports
from proxy.context import GATEWAY
from proxy.front.openai import parse_request
from proxy.sync.state_store import MemoryStore
from proxy.sync.state_sync import STATE_SYNC, StateSync
from proxy.types import Route
from routing.types import NO_MATCH
from tests.conftest import Gw, StartGateway
from tests.proxy.conftest import EMU_FLAGS, MODEL, Emulators, wait_for
from tests.redis_server import RedisServer

JSON = {"Content-Type": "application/json"}
TIMEOUT = aiohttp.ClientTimeout(total=30)
SECRET = "zanzibar-quokka-marmalade"  # a word that must never reach the store


async def replicas(emulators: Emulators, n: int) -> list[str]:
    return [(await emulators(*EMU_FLAGS)).url for _ in range(n)]


async def gateways(start: StartGateway, urls: list[str], n: int, **settings: Any) -> list[Gw]:
    defaults = {"health_interval": 0.1, "policy": "cost", "retries": 2}
    gws = [await start(urls, **(defaults | settings)) for _ in range(n)]
    for g in gws:
        if STATE_SYNC in g.app:
            await wait_for(lambda g=g: g.app[STATE_SYNC].ready.is_set(), 10)
    return gws


def prompt(i: int) -> list[dict[str, str]]:
    doc = f"Document {i}: {SECRET}. " + " ".join(f"fact{i}-{k}" for k in range(300))
    return [{"role": "system", "content": doc}, {"role": "user", "content": f"question about {i}?"}]


async def stream(url: str, i: int, session: aiohttp.ClientSession) -> None:
    """A streamed request (only those teach rates: their first byte times the prefill)."""
    body = orjson.dumps({"model": MODEL, "messages": prompt(i), "max_tokens": 16, "stream": True})
    async with session.post(url + "/v1/chat/completions", data=body, headers=JSON) as r:
        assert r.status == 200
        await r.read()


async def ask(url: str, i: int, session: aiohttp.ClientSession) -> tuple[str, int]:
    body = orjson.dumps({"model": MODEL, "messages": prompt(i), "max_tokens": 2})
    async with session.post(url + "/v1/chat/completions", data=body, headers=JSON) as r:
        doc = await r.json()
        assert r.status == 200, doc
        details = doc["usage"].get("prompt_tokens_details") or {}
        return r.headers["x-kvroute-replica"], int(details.get("cached_tokens") or 0)


async def settle(gws: list[Gw]) -> None:
    await asyncio.sleep(0.3)  # a few sync rounds (50 ms each)


async def test_repeats_through_another_gateway_reach_the_holder(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 3)
    a, b = await gateways(gateway, urls, 2, state=redis_server.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        first = {i: (await ask(a.url, i, s))[0] for i in range(6)}
        await settle([a, b])
        for i in range(6):
            replica, cached = await ask(b.url, i, s)
            assert replica == first[i], f"document {i} left its holder"
            assert cached > 0
    status = b.app[STATE_SYNC].status()
    assert status["state"] == "synced" and status["peers"] == 1 and status["applied_events"] >= 6


async def test_loads_and_rates_are_shared(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 2)
    a, b = await gateways(gateway, urls, 2, state=redis_server.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for i in range(8):
            await stream(a.url, i, s)
    await asyncio.sleep(1.2)  # rates are published every second
    learned = a.gw.router.rates.export()
    assert learned.replicas, "gateway a learned nothing"
    view_b = b.gw.router.rates.get(next(iter(learned.replicas)))
    assert view_b.samples >= 1, "gateway b did not adopt a's rates"
    lease = a.gw.fleet.acquire(urls[0], _work())  # a request in flight on a, as b sees it
    try:
        await wait_for(lambda: b.gw.fleet.get(urls[0]).state().inflight_requests == 1, 3)
        assert b.gw.fleet.get(urls[0]).state().kv_tokens == 1016  # the KV it holds, shared too
        a.gw.fleet.get(urls[0]).running_reserve = 0.5  # as a's scrape of the replica set it
        lease.first_token()  # running now: its 16-token budget counts at the replica's ratio, on b too
        await wait_for(lambda: b.gw.fleet.get(urls[0]).state().kv_tokens == 1008, 3)
    finally:
        lease.release()
    await wait_for(lambda: b.gw.fleet.get(urls[0]).state().inflight_requests == 0, 3)


def _work() -> Any:
    from proxy.fleet.load import Work

    return Work(time.monotonic(), 1000, 0.5, 0.5, budget=16, streamed=True, kv_tokens=1016)


async def test_redis_killed_restarted_and_flushed_mid_run_loses_no_request(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 2)
    a, b = await gateways(gateway, urls, 2, state=redis_server.url)
    failures: list[str] = []

    async def traffic(n: int) -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            for i in range(n):
                try:
                    await ask((a, b)[i % 2].url, i % 5, s)
                except AssertionError as e:
                    failures.append(str(e))

    run = asyncio.create_task(traffic(60))
    await asyncio.sleep(0.3)
    redis_server.stop()
    await wait_for(lambda: a.app[STATE_SYNC].stats.state == "degraded", 5)
    assert "kvroute_state_sync_up 0.0" in a.metrics()
    await asyncio.sleep(0.3)
    redis_server.start()
    await wait_for(lambda: a.app[STATE_SYNC].stats.state == "synced", 10)
    redis_server.client().flushall()
    await run
    assert failures == []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        await ask(a.url, 99, s)
    # b resumes within its own backoff (full jitter, up to RETRY_MAX_S = 5 s), not when a does
    await wait_for(lambda: b.app[STATE_SYNC].stats.state == "synced", 10)
    assert a.app[STATE_SYNC].status()["failures"] >= 1
    # writing again after the flush: request 99's routing goes out in a's next round, not with its answer
    await wait_for(lambda: redis_server.client().exists("kvroute:{kvroute}:events") == 1, 5)


async def test_keys_expire_and_hold_no_prompt_text(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 2)
    (a,) = await gateways(gateway, urls, 1, state=redis_server.url, session_header="x-session-id")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        for i in range(4):
            await ask(a.url, i, s)
    await settle([a])
    client = redis_server.client()
    keys = list(client.scan_iter("*"))
    assert keys and all(k.startswith(b"kvroute:{kvroute}:") for k in keys)
    for key in keys:
        assert 0 < client.ttl(key) <= 24 * 3600, key
        kind = client.type(key)
        values: list[bytes]
        if kind == b"stream":
            values = [v for _, fields in client.xrange(key) for v in fields.values()]
        elif kind == b"zset":
            values = list(client.zrange(key, 0, -1))
        else:
            values = [client.get(key) or b""]
        for v in values:
            assert SECRET.encode() not in v and b"fact1-" not in v, key


async def test_a_gateway_that_starts_later_replays_the_map_before_it_is_ready(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 3)
    (a,) = await gateways(gateway, urls, 1, state=redis_server.url)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        first = {i: (await ask(a.url, i, s))[0] for i in range(8)}
        await settle([a])
        (late,) = await gateways(gateway, urls, 1, state=redis_server.url)
        hits = [await ask(late.url, i, s) for i in range(8)]
    assert [r for r, _ in hits] == [first[i] for i in range(8)]
    assert all(cached > 0 for _, cached in hits)


async def test_two_gateways_in_one_process_share_one_memory_store(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = await replicas(emulator_server, 3)
    a, b = await gateways(gateway, urls, 2, state="memory")
    shared = MemoryStore()
    for g in (a, b):
        g.app[STATE_SYNC].store = shared
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        first = {i: (await ask(a.url, i, s))[0] for i in range(5)}
        await settle([a, b])
        assert [(await ask(b.url, i, s))[0] for i in range(5)] == [first[i] for i in range(5)]


async def test_gateway_processes_started_with_the_flag_agree(
    redis_server: RedisServer, emulator_server: Emulators
) -> None:
    import sys

    from bench.systems.procs import ManagedProcess

    urls = await replicas(emulator_server, 3)
    ports = free_ports(2)
    procs = []
    for port in ports:
        argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--state", redis_server.url]
        argv += [x for u in urls for x in ("--backend", u)]
        procs.append(
            ManagedProcess(argv, [f"http://127.0.0.1:{port}"], ready_path="/ready", ready_check=bool)
        )
    async with procs[0] as a, procs[1] as b, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        first = [(await ask(a.urls[0], i, s))[0] for i in range(6)]
        await asyncio.sleep(0.3)
        assert [(await ask(b.urls[0], i, s))[0] for i in range(6)] == first


async def test_ready_waits_for_the_start_up_replay_and_not_beyond_its_cap(
    emulator_server: Emulators, gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that accepts connections and never answers: /ready is 503 while the replay waits, 200
    once START_WAIT_S has passed (the gateway then routes on its own view, degraded)."""
    import proxy.sync.state_sync

    monkeypatch.setattr(proxy.sync.state_sync, "START_WAIT_S", 1.5)
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    urls = await replicas(emulator_server, 1)
    g = await gateway(urls, health_interval=0.1, state=f"redis://127.0.0.1:{port}/0")
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            await wait_for(lambda: any(r.healthy for r in g.app[STATE_SYNC].gw.fleet.replicas()), 5)
            async with s.get(g.url + "/ready") as resp:
                assert resp.status == 503
                assert (await resp.json())["state"] == "replaying the shared log"
            await wait_for(lambda: g.app[STATE_SYNC].ready.is_set(), 5)
            async with s.get(g.url + "/ready") as resp:
                assert resp.status == 200
    finally:
        for w in held:
            w.close()
        silent.close()


@pytest.mark.parametrize("kind", ["redis", "memory"])
async def test_a_stopping_gateway_leaves_the_store_at_once(kind: str, redis_server: RedisServer) -> None:
    """Its heartbeat and documents go when it stops, so the others stop counting it as a peer, and
    its load, now rather than when they expire (60 s and 5 s)."""
    from proxy.sync.redis_store import RedisStore
    from proxy.sync.state_store import Doc, StateStore

    store: StateStore = RedisStore(redis_server.url, "leave") if kind == "redis" else MemoryStore()
    try:
        for g in ("a", "b"):
            await store.publish(g, [], {"load": Doc(orjson.dumps({"r": [1, 0, 0.5, 0.1, 0.2]}), 5.0)})
        assert set((await store.gather(["load"], skip="c"))["load"]) == {"a", "b"}
        await store.leave("a", ["load"])
        assert set((await store.gather(["load"], skip="c"))["load"]) == {"b"}
    finally:
        await store.close()


async def test_the_others_stop_counting_a_gateway_as_soon_as_it_stops(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    from proxy.config.settings import Settings
    from proxy.server import build_app
    from tests.conftest import serve

    urls = await replicas(emulator_server, 1)
    (b,) = await gateways(gateway, urls, 1, state=redis_server.url)
    stats = b.app[STATE_SYNC].stats
    settings = Settings(backends=tuple(urls), health_interval=0.1, state=redis_server.url)
    async with serve(build_app(settings)):
        await wait_for(lambda: stats.peers == 1, 10)
    t0 = time.monotonic()
    await wait_for(lambda: stats.peers == 0, 10)
    assert time.monotonic() - t0 < 2.0  # not the 5 s of its load document's expiry


async def test_routed_requests_reach_the_others_without_waiting_for_a_round(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    """With the polling interval set to 10 s, a request routed by one gateway still reaches the other
    within a blocking read: the publisher is kicked by the Router's outbox and the reader waits on the
    log (the routed blocks arrive in well under a second, not at the next 10 s round)."""
    urls = await replicas(emulator_server, 3)
    a, b = await gateways(gateway, urls, 2, state=redis_server.url)
    for g in (a, b):
        g.app[STATE_SYNC].interval_s = 10.0
    await asyncio.sleep(0.6)  # the loops' current waits (of the old interval, reads capped at 0.5 s) end
    seen = b.app[STATE_SYNC].stats.applied_events
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        holder, _ = await ask(a.url, 1, s)
        t0 = time.monotonic()
        await wait_for(lambda: b.app[STATE_SYNC].stats.applied_events > seen, 5)
        assert time.monotonic() - t0 < 2.0
        # a's load on the holder came with its event; its end (a kicked round, no event) within a read
        await wait_for(lambda: _remote_requests(b, holder) == 0, 2)
        held = await _held_tokens(b, 1)
        assert held[holder] > 0 and all(n == 0 for r, n in held.items() if r != holder), held


async def _held_tokens(gw: Gw, i: int) -> dict[str, int]:
    """Per replica, the tokens of ``prompt(i)`` that ``gw``'s cache model holds there (all tiers).

    Asked of the model, not of a routed request: which replica a repeat goes to also weighs the load the
    other gateway's request left behind (its arrival rate decays over seconds), and that is not what
    the test is about."""
    body = orjson.dumps({"model": MODEL, "messages": prompt(i), "max_tokens": 2})
    parsed = await gw.gw.exact(gw.gw.resolve_model(parse_request(Route.CHAT, body, None, None)))
    router, fleet = gw.gw.router, gw.gw.fleet
    model = next(iter(fleet.models()))
    where = router.where(router.prepare(parsed.routing), fleet.snapshot(model))
    return {r.id: int(where.get(r.id, NO_MATCH).total_tokens) for r in fleet.replicas()}


def _remote_requests(gw: Gw, replica: str) -> int:
    """In-flight requests other gateways report on ``replica``, as ``gw`` sees them."""
    r = gw.app[GATEWAY].fleet.get(replica)
    return r.remote.inflight_requests if r is not None and r.remote is not None else 0


async def test_another_gateways_round_without_events_ends_a_blocking_read(redis_server: RedisServer) -> None:
    """A round that only renews documents (a first token, a finished request) is a pulse: it wakes the
    other gateways' blocking reads (an empty batch of its gateway), so they gather the change now; a
    gateway's own pulses do not."""
    from proxy.sync.redis_store import RedisStore
    from proxy.sync.state_store import Batch, Doc

    a, b = RedisStore(redis_server.url, "pulse"), RedisStore(redis_server.url, "pulse")
    doc = {"load": Doc(orjson.dumps({"r": [0, 0, 0.0, 0.1, 0.2]}), 5.0)}
    try:
        await b.publish("b", [], doc)
        t0 = time.monotonic()
        assert await b.read("0", block_s=0.4) == ([], "0")  # only its own pulse: waits it out
        assert time.monotonic() - t0 >= 0.35
        await a.publish("a", [], doc)
        t0 = time.monotonic()
        assert await b.read("0", block_s=0.45) == ([("0", Batch("a", ()))], "0")  # a's pulse: at once
        assert time.monotonic() - t0 < 0.3
    finally:
        await a.close()
        await b.close()


class CancelToTimeout(MemoryStore):
    """A store whose blocking read turns a cancel into ``TimeoutError``, as redis-py's read may when the
    cancel meets its own socket time-out (the task is then still marked as cancelling)."""

    swallow, swallowed = True, 0

    async def read(self, since: str, block_s: float = 0.0) -> Any:
        try:
            await asyncio.sleep(block_s)  # always the whole wait: the reader is nearly always in here
        except asyncio.CancelledError:
            if not self.swallow:
                raise
            self.swallowed += 1
            raise TimeoutError("read timed out") from None
        return await super().read(since)


def loops_of(sync: StateSync) -> list[asyncio.Task[Any]]:
    """The tasks still running one of ``sync``'s coroutines (run, and the reader and publisher that
    ``asyncio.gather`` wraps in tasks of their own)."""
    frames = [(t, getattr(t.get_coro(), "cr_frame", None)) for t in asyncio.all_tasks()]
    return [t for t, f in frames if f is not None and f.f_locals.get("self") is sync]


async def test_a_cancel_the_store_turns_into_a_time_out_still_stops_the_sync(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    """The reader, had it taken the time-out for a store in trouble, would have looped on, and the run
    task waits for it."""
    (g,) = await gateways(gateway, await replicas(emulator_server, 1), 1, state="memory")
    store = CancelToTimeout()
    sync = StateSync(g.app[GATEWAY], store, interval_s=0.2)
    task = asyncio.create_task(sync.run())
    try:
        await wait_for(sync.ready.is_set, 5)
        await asyncio.sleep(0.05)  # the reader is in its blocking read
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0.05)
        assert store.swallowed and task.cancelled() and loops_of(sync) == []
    finally:  # without the stop the reader loops on: let the next cancel through
        store.swallow = False
        for t in loops_of(sync):
            t.cancel()
        await asyncio.sleep(0.3)
