"""Fault handling through the gateway on in-process emulated replicas: a hung replica is detected by the
first-byte deadline, aborted and retried elsewhere, and its breaker opens; an idle stream ends with
one SSE error event; the retry budget returns the replica's error instead of retrying; a replica that
restarted with its cache lost is used again as soon as it is healthy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.upstream.breaker import BreakerState
from tests.proxy.conftest import ADMIN, EMU_FLAGS, MODEL, Stack, StackFactory, post, wait_for

JSON = {"Content-Type": "application/json"}
FAST = {  # deadlines for a fleet whose modelled time runs 100x faster
    "first_byte_timeout": 0.3,
    "first_byte_timeout_margin": 0.1,
    "decode_timeout_per_token": 0.01,
}


def chat(text: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return (
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        | ({"stream": True} if stream else {})
        | extra
    )


async def ask(url: str, body: dict[str, Any]) -> tuple[int, list[bytes], str]:
    """(status, the body's SSE data lines or the whole body, the replica that answered)."""
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        raw = await r.read()
        replica = r.headers.get("x-kvroute-replica", "")
    if body.get("stream"):
        return r.status, [ln[6:] for ln in raw.split(b"\n") if ln.startswith(b"data: ")], replica
    return r.status, [raw], replica


def breaker(stack: Stack, url: str) -> BreakerState:
    replica = stack.gw.fleet.get(url)
    assert replica is not None
    return replica.breaker.state(time.monotonic())


async def test_a_hung_replica_is_aborted_retried_elsewhere_and_ejected(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=2, breaker_failures=2, breaker_cooldown=60.0, **FAST)
    hung, good = stack.replicas
    await hung.fault(action="hang", count=2)
    rids = [f"client-rid-{i}" for i in range(4)]
    answers = [await ask(stack.url, chat(f"q{i}", stream=i % 2 == 0, rid=rids[i])) for i in range(4)]
    assert all(status == 200 for status, _, _ in answers)
    assert all(lines[-1] == b"[DONE]" for status, lines, _ in answers[::2])
    assert {replica for _, _, replica in answers} == {good.url}  # the two that hung were retried
    await wait_for(lambda: len(hung.replica.aborts.to_json()["rids"]) == 2)  # type: ignore[arg-type]
    assert set(hung.replica.aborts.to_json()["rids"]) <= set(rids)  # type: ignore[arg-type]
    assert breaker(stack, hung.url) is BreakerState.OPEN
    assert f'kvroute_replica_breaker_state{{replica="{hung.url}"}} 2' in stack.metrics()
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        doc = await r.json()
    assert {r["id"]: r["breaker"]["state"] for r in doc["replicas"]}[hung.url] == "open"


async def test_a_stream_idle_after_its_first_byte_ends_with_one_sse_error(
    stack_factory: StackFactory,
) -> None:
    stack = await stack_factory(n=1, idle_timeout=0.03, first_byte_timeout=30.0)
    await stack.replicas[0].fault(action="slow", factor=400)  # 25 ms per token x 400 x 0.01: 100 ms
    status, lines, _ = await ask(stack.url, chat("slow", stream=True))
    assert status == 200 and lines[-1] != b"[DONE]"
    error = orjson.loads(lines[-1])["error"]
    assert error["code"] == "upstream_timeout" and "idle" in error["message"]
    assert sum(b'"error"' in ln for ln in lines) == 1
    assert "kvroute_stream_errors_total" in stack.metrics()


async def test_an_empty_retry_budget_relays_the_replicas_own_error(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=2, retry_budget=0.0, retry_budget_floor=0.0)
    for r in stack.replicas:
        await r.fault(action="fail", status=503, count=1)
    status, body, _ = await ask(stack.url, chat("no retry"))
    assert status == 503 and b"Emulated fault" in body[0]
    assert 'kvroute_retry_budget_exhausted_total{route="chat"} 1' in stack.metrics()


async def test_a_restarted_replica_is_used_again_as_soon_as_it_is_healthy(
    stack_factory: StackFactory,
) -> None:
    stack = await stack_factory(n=2, breaker_failures=2, breaker_cooldown=60.0)
    sick, good = stack.replicas
    await sick.fault(action="fail", status=500, count=2)
    replicas = [(await ask(stack.url, chat(f"q{i}")))[2] for i in range(4)]
    assert set(replicas) == {good.url} and breaker(stack, sick.url) is BreakerState.OPEN
    await stack.emulators.stop(sick)
    fresh = await stack.emulators(*EMU_FLAGS, port=sick.port)  # a new process: its cache is empty
    await wait_for(lambda: breaker(stack, sick.url) is BreakerState.CLOSED)
    replicas = [(await ask(stack.url, chat(f"r{i}")))[2] for i in range(4)]
    assert sick.url in replicas and await fresh.served() >= 1


async def test_breakers_never_eject_more_than_half_of_the_fleet(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=4, breaker_failures=1, breaker_cooldown=60.0)
    for r in stack.replicas[:3]:  # three sick replicas, one well: their 500s are theirs
        await r.fault(action="fail", status=500, count=50)
    statuses = [(await ask(stack.url, chat(f"q{i}")))[0] for i in range(12)]
    assert 200 in statuses  # retried onto the well replica (three sick in a row: their 500)
    states = [breaker(stack, url) for url in stack.urls]
    assert states.count(BreakerState.OPEN) == 2 and breaker(stack, stack.urls[3]) is BreakerState.CLOSED


async def test_a_body_every_replica_fails_on_blames_none_of_them(stack_factory: StackFactory) -> None:
    """Every replica answers the same request 500: the request's fault, not theirs; the client gets
    the replica's own answer (never a 5xx of kvroute's making) and no breaker opens."""
    stack = await stack_factory(n=2, breaker_failures=1, breaker_cooldown=60.0)
    for r in stack.replicas:
        await r.fault(action="fail", status=500, count=3)
    status, _, replica = await ask(stack.url, chat("q"))
    assert status == 500 and replica in stack.urls  # relayed, x-kvroute-replica set
    assert [breaker(stack, url) for url in stack.urls] == [BreakerState.CLOSED] * 2


async def test_a_request_queued_on_a_working_replica_waits_there_past_its_first_byte_deadline(
    stack_factory: StackFactory,
) -> None:
    """One running slot per replica; a long answer streams from the first one while a second request
    waits there for the slot, far past its 0.3 s first-byte deadline: the replica is working (it streams),
    so the request is not aborted and moved, and its replica's breaker counts nothing."""
    stack = await stack_factory(
        n=2,
        emu_flags=("--max-running-requests", "1"),
        first_byte_timeout=0.3,
        first_byte_timeout_factor=0.0,
        first_byte_timeout_margin=0.0,
    )
    for emu in stack.replicas:
        await emu.fault(action="slow", factor=40)  # 25 ms per token x 40 x 0.01: 10 ms per streamed token
    long = chat("long", stream=True, max_tokens=150)  # exactly 150 tokens
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", json=long) as r:
        busy = stack.replica(r.headers["x-kvroute-replica"])
        await r.content.readuntil(b"\n\n")  # it runs
        assert (await ask(stack.url, chat("filler")))[2] != busy.url  # round robin: the other replica
        status, lines, replica = await ask(stack.url, chat("queued", stream=True))  # and back
        assert (await r.read()).endswith(b"data: [DONE]\n\n")  # the long answer was not disturbed
    assert status == 200 and lines[-1] == b"[DONE]" and replica == busy.url
    metrics = stack.metrics()
    assert f'kvroute_first_byte_waits_extended_total{{replica="{busy.url}"}} 1' in metrics
    assert "kvroute_retries_total{" not in metrics and breaker(stack, busy.url) is BreakerState.CLOSED
    assert len(await busy.generations()) == 2  # never aborted: two requests reached it, each once


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_the_replica_lost_while_it_works_is_moved_on(
    stack_factory: StackFactory, stream: bool
) -> None:
    """The replica accepts one request and never answers it ("hang") while it streams a long answer to
    another client: it is working, so a streamed request's wait would go on past its 0.3 s deadline
    until the long answer ends (~8 s). But three requests sent after it get their first bytes while it is
    past its deadline, on a replica that starts prefills in arrival order: it is not queued there, so it
    is retried at once (the fault is spent: the retry, on the same replica, is answered). An answer that
    is not streamed never waits on past its deadline (0.3 s + 4 tokens x 10 ms)."""
    stack = await stack_factory(
        n=1,
        first_byte_timeout=0.3,
        first_byte_timeout_factor=0.0,
        first_byte_timeout_margin=0.0,
        decode_timeout_per_token=0.01,
    )
    emu = stack.replicas[0]
    await emu.fault(action="slow", factor=40)  # 10 ms per streamed token
    long = chat("long", stream=True, max_tokens=2000)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", json=long) as r:
        await r.content.readuntil(b"\n\n")  # it runs, and will for ~8 s
        await emu.fault(action="hang", count=1)
        t0 = loop.time()
        lost = asyncio.ensure_future(ask(stack.url, chat("lost", stream=stream)))
        await asyncio.sleep(0.4)  # past its deadline (a streamed one is kept waiting: the replica works)
        for i in range(3):
            assert (await ask(stack.url, chat(f"later {i}", stream=True)))[0] == 200
        status, lines, _ = await lost
        waited = loop.time() - t0
        assert not r.content.at_eof()  # the replica still works (the client leaves it now)
    assert status == 200 and (lines[-1] == b"[DONE]" if stream else b'"choices"' in lines[0])
    assert waited < 2.5, waited  # not until the long answer ended
    assert f'kvroute_retries_total{{replica="{emu.url}"}} 1' in stack.metrics()
    assert len(await emu.generations()) == 6  # the long one, the lost one and its retry, three later ones


async def test_a_clients_bad_request_gets_openais_shape_and_blames_no_replica(
    stack_factory: StackFactory,
) -> None:
    """SGLang answers a bad request 400 in its flat shape (``{"object": "error", ...}``): the client gets
    OpenAI's ``{"error": {message, type, param, code}}``. Many 400s, a 503 retried onto a replica that
    answers 400 (the request's fault, so the 503 may be too), and requests the gateway refused itself
    open no breaker and count no failure."""
    stack = await stack_factory(n=2, breaker_failures=1, breaker_cooldown=60.0)
    for r in stack.replicas:
        await r.fault(action="fail", status=400, count=10)
    for i in range(20):
        body = orjson.dumps(chat(f"bad {i}", stream=i % 2 == 1))  # a stream's 400 is a JSON body too
        status, raw, headers = await post(stack.url, "/v1/chat/completions", body, JSON)
        err = orjson.loads(raw)["error"]
        assert status == 400 and headers["x-kvroute-replica"] in stack.urls
        assert set(err) == {"message", "type", "param", "code"}
        assert (
            err["type"] == "invalid_request_error"
            and err["code"] == 400
            and "Emulated fault" in err["message"]
        )
    sick, strict = stack.replicas
    await sick.fault(action="fail", status=503, count=1)
    await strict.fault(action="fail", status=400, count=2)
    assert [(await ask(stack.url, chat(f"q{i}")))[0] for i in range(2)] == [400, 400]
    async with aiohttp.ClientSession() as s:
        for _ in range(5):  # refused by the gateway: no replica sees them
            async with s.post(stack.url + "/v1/chat/completions", data=b"{") as r:
                assert r.status == 400
    assert [breaker(stack, url) for url in stack.urls] == [BreakerState.CLOSED] * 2
    assert all(r.breaker.failures == 0 and r.healthy for r in stack.gw.fleet.replicas())
