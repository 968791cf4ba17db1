"""Overload protection: a bounded number of requests waiting per replica (routing prefers the replicas
below the bound; 429 + Retry-After when all are at it) and in progress in the gateway. Waiting requests
are held with the emulator's ``hang`` fault (accepted, never answered)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from tests.proxy.conftest import ADMIN, MODEL, Stack, StackFactory, wait_for

STREAM = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "stream": True}


async def _post(s: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], dict[str, object]]:
    async with s.post(url + "/v1/completions", json=STREAM) as r:
        body = await r.read()
        doc = await r.json() if r.content_type == "application/json" else {}
        assert body
        return r.status, dict(r.headers), doc


@asynccontextmanager
async def _held(s: aiohttp.ClientSession, stack: Stack, n: int) -> AsyncIterator[None]:
    """``n`` more requests hanging on the replicas (the caller armed the faults); cancelled at the end."""
    before = sum(len(r.load.queue) for r in stack.gw.fleet.replicas())
    tasks = [asyncio.create_task(_post(s, stack.url)) for _ in range(n)]
    try:
        await wait_for(lambda: sum(len(r.load.queue) for r in stack.gw.fleet.replicas()) == before + n)
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _waiting(stack: Stack) -> dict[str, int]:
    return {r.id: len(r.load.queue) for r in stack.gw.fleet.replicas()}


async def test_a_full_replica_is_avoided_and_all_full_is_429(stack_factory: StackFactory) -> None:
    stack = await stack_factory(2, max_waiting_per_replica=1, max_queue_s=0)
    for r in stack.replicas:
        await r.fault(action="hang", count=1)
    async with aiohttp.ClientSession() as s, _held(s, stack, 1):
        full = next(rid for rid, n in _waiting(stack).items() if n == 1)
        free = next(u for u in stack.urls if u != full)
        await stack.replica(free).fault(action="clear")
        for _ in range(4):  # round robin would send half of them to the full replica
            status, headers, _ = await _post(s, stack.url)
            assert status == 200 and headers["x-kvroute-replica"] == free
        await stack.replica(free).fault(action="hang", count=1)
        async with _held(s, stack, 1):
            status, headers, doc = await _post(s, stack.url)
            assert status == 429 and int(headers["Retry-After"]) >= 1
            assert doc["error"] == doc["error"] | {"type": "rate_limit_error", "code": "overloaded"}  # type: ignore[operator]
    assert 'kvroute_rejections_total{reason="replicas_full"} 1' in stack.metrics()
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        assert (await r.json())["admission"]["rejected"] == {"replicas_full": 1}


async def test_a_replica_is_full_only_once_its_queue_is_long_in_time(stack_factory: StackFactory) -> None:
    """Past the count bound with little predicted prefill waiting (a burst of short requests) the
    replica still takes requests: the bound is in seconds of queue, not in requests."""
    stack = await stack_factory(1, max_waiting_per_replica=1)  # max_queue_s: the default 60 s
    await stack.replicas[0].fault(action="hang", count=1)
    async with aiohttp.ClientSession() as s, _held(s, stack, 1):
        assert _waiting(stack) == {stack.urls[0]: 1}
        status, _, _ = await _post(s, stack.url)
        assert status == 200
    assert "replicas_full" not in stack.metrics()


async def test_past_max_inflight_is_429(stack_factory: StackFactory) -> None:
    stack = await stack_factory(1, max_inflight=2)
    await stack.replicas[0].fault(action="hang", count=2)
    async with aiohttp.ClientSession() as s, _held(s, stack, 2):
        status, headers, doc = await _post(s, stack.url)
        assert status == 429 and headers["Retry-After"] == "1"
        assert "max_inflight" in str(doc)
        async with s.get(stack.url + "/v1/models") as r:
            assert r.status == 200  # not a generation request
    async with aiohttp.ClientSession() as s:
        await wait_for(lambda: stack.gw.admission.inflight == 0)
        assert (await _post(s, stack.url))[0] == 200  # room again once they ended
    assert 'kvroute_rejections_total{reason="gateway_full"} 1' in stack.metrics()
