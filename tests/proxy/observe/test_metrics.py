"""Every metric family of the gateway's /metrics after known traffic, against real emulated replicas.

Requests go through the gateway (round robin over two replicas, so where each went is known from the
x-kvroute-replica header); the expected values come from what the clients saw (status codes, usage) and
from the replicas' own counters, never from the gateway's internals alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.observe.collectors import KEY_BYTES
from proxy.observe.metrics import GatewayMetrics
from tests.proxy.conftest import ADMIN, MODEL, SYSTEM, Stack, StackFactory, wait_for
from tests.proxy.prom import by, samples, value

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


async def chat(url: str, content: str, stream: bool, model: str = MODEL) -> tuple[int, str, dict[str, Any]]:
    """(status, replica that served it, usage) of one chat request through the gateway."""
    body: dict[str, Any] = {"model": model, "messages": [SYSTEM, {"role": "user", "content": content}]}
    body |= {"max_tokens": 4, "stream": stream} | (
        {"stream_options": {"include_usage": True}} if stream else {}
    )
    async with aiohttp.ClientSession() as s, s.post(url + CHAT, data=orjson.dumps(body), headers=JSON) as r:
        raw = await r.read()
        replica = r.headers.get("x-kvroute-replica", "")
    if not stream:
        return r.status, replica, orjson.loads(raw).get("usage") or {}
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    usage = next((e["usage"] for e in reversed(events) if e.get("usage")), {})
    return r.status, replica, usage


async def scrape(stack: Stack) -> str:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/metrics", headers=ADMIN) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await r.text()


async def status(stack: Stack) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        doc: dict[str, Any] = await r.json()
        return doc


async def test_request_families_after_known_traffic(stack_factory: StackFactory) -> None:
    stack = await stack_factory(single_model_fallback=False)
    seen = [await chat(stack.url, "the same question", stream=True) for _ in range(4)]
    seen.append(await chat(stack.url, "the same question", stream=False))
    assert [s for s, _, _ in seen] == [200] * 5 and {r for _, r, _ in seen} == set(stack.urls)
    assert (await chat(stack.url, "x", stream=False, model="no-such-model"))[0] == 404
    text = await scrape(stack)
    assert value(text, "kvroute_requests_total", route=CHAT, status="200") == 5
    assert value(text, "kvroute_requests_total", route=CHAT, status="404") == 1
    assert value(text, "kvroute_errors_total", route=CHAT, status_class="4xx", error="model_not_found") == 1
    assert value(text, "kvroute_decisions_total", policy="round_robin", reason="round_robin") == 5
    assert value(text, "kvroute_ttft_seconds_count", route="chat") == 4  # the streamed ones
    assert value(text, "kvroute_request_duration_seconds_count", route="chat") == 5
    streams = [r for _, r, _ in seen[:4]]
    doc = await status(stack)
    for replica in stack.urls:
        served = [u for _, r, u in seen if r == replica]
        ttft_count = value(text, "kvroute_replica_ttft_seconds_count", replica=replica)
        assert ttft_count == streams.count(replica)
        assert value(text, "kvroute_replica_request_duration_seconds_count", replica=replica) == len(served)
        prompt = value(text, "kvroute_prompt_tokens_total", replica=replica)
        assert prompt == sum(u["prompt_tokens"] for u in served)
        cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in served)
        assert value(text, "kvroute_cached_tokens_total", replica=replica) == cached > 0  # a repeat
        mine = [d for d in doc["decisions"] if d["replica"] == replica]
        predicted = sum(d["predicted_cached_tokens"] for d in mine)
        assert value(text, "kvroute_predicted_cached_tokens_total", replica=replica) == pytest.approx(
            predicted
        )
        assert predicted > 0  # its second request was predicted to find the first one's prefix
        ttft_sum = value(text, "kvroute_replica_ttft_seconds_sum", replica=replica)
        assert ttft_sum == pytest.approx(sum(d["ttft_s"] for d in mine if d["ttft_s"] is not None))
    assert (value(text, "process_resident_memory_bytes") or 0) > 0


async def test_error_answers_by_the_code_kvroute_made(stack: Stack) -> None:
    await stack.replicas[0].fault(action="fail", status=400)  # the replica's own error, relayed
    await stack.replicas[1].fault(action="fail", status=400)
    assert (await chat(stack.url, "a", stream=False))[0] == 400
    for r in stack.replicas:
        await r.fault(action="clear")
        await r.fault(action="reset", count=5)  # every connection reset before any byte
    assert (await chat(stack.url, "b", stream=False))[0] == 502
    for r in stack.replicas:
        await r.fault(action="clear")
        await r.fault(action="unhealthy")
    await wait_for(lambda: not any(r.healthy for r in stack.gw.fleet.replicas()))
    assert (await chat(stack.url, "c", stream=False))[0] == 503
    text = await scrape(stack)
    errors = samples(text)["kvroute_errors_total"]
    assert {dict(k)["error"]: (dict(k)["status_class"], v) for k, v in errors.items()} == {
        "replica": ("4xx", 1.0),
        "upstream_unavailable": ("5xx", 1.0),
        "no_replica_available": ("5xx", 1.0),
    }
    assert by(text, "kvroute_upstream_errors_total", "kind") == {"upstream_unavailable": 3.0}
    assert sum(by(text, "kvroute_retries_total", "replica").values()) == 2  # 1 + retries=2 attempts
    assert sum(by(text, "kvroute_replica_healthy", "replica").values()) == 0


async def test_cut_streams_and_departed_clients_are_counted(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="cut_stream", after_chunks=2)
    status, served, _ = await chat(stack.url, "a stream that breaks", stream=True)
    text = await scrape(stack)
    assert status == 200 and by(text, "kvroute_stream_errors_total", "replica") == {served: 1.0}
    assert samples(text).get("kvroute_errors_total") is None  # a 200 that broke later: not an error answer
    for r in stack.replicas:
        await r.fault(action="clear")
    body = {"model": MODEL, "messages": [SYSTEM], "stream": True, "max_tokens": 20_000}
    async with aiohttp.ClientSession() as s:
        r = await s.post(stack.url + CHAT, data=orjson.dumps(body), headers=JSON)
        await r.content.readuntil(b"\n\n")
        r.close()  # the client leaves mid-stream

    async def counted() -> bool:
        return value(await scrape(stack), "kvroute_client_disconnects_total", route="chat") == 1

    await wait_for(counted)


async def test_load_and_cache_model_gauges(stack: Stack) -> None:
    for _ in range(2):
        await chat(stack.url, "warm the model " * 30, stream=True)
    for r in stack.replicas:
        await r.fault(action="hang")  # accepted, never answered: the next request stays queued
    task = asyncio.ensure_future(chat(stack.url, "a long new prompt " * 200, stream=True))
    try:
        await wait_for(lambda: sum(r.inflight_requests for r in stack.gw.fleet.replicas()) == 1)
        text = await scrape(stack)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    busy = [r.id for r in stack.gw.fleet.replicas() if r.inflight_requests]
    assert by(text, "kvroute_inflight_requests", "replica") == {u: float(u in busy) for u in stack.urls}
    queued = by(text, "kvroute_replica_queued_prefill_seconds", "replica")
    assert queued[busy[0]] > 0 and sum(queued.values()) == queued[busy[0]]
    tokens = by(text, "kvroute_replica_queued_prefill_tokens", "replica")[busy[0]]
    assert tokens > 800
    held = by(text, "kvroute_replica_held_kv_tokens", "replica")  # its uncached prompt + its output budget
    assert held[busy[0]] > tokens and sum(held.values()) == held[busy[0]]
    # the queued request is in service on its replica (the others served only near-instant warm-ups)
    assert by(text, "kvroute_replica_utilization_ratio", "replica")[busy[0]] > 0
    assert all(v > 0 for v in by(text, "kvroute_replica_arrival_rate_per_second", "replica").values())
    router = stack.gw.router.status()
    for replica in stack.urls:
        view = router.replicas[replica]
        blocks = value(text, "kvroute_cache_model_blocks", replica=replica, tier="gpu")
        assert blocks == view.gpu.blocks > 0
        assert value(text, "kvroute_cache_model_tokens", replica=replica, tier="gpu") == view.gpu.tokens
        assert value(text, "kvroute_cache_model_capacity_tokens", replica=replica, tier="gpu") == 100_000
        assert value(text, "kvroute_cache_model_capacity_tokens", replica=replica, tier="host") == 200_016
        assert (
            value(text, "kvroute_cache_model_bytes", replica=replica, tier="gpu") or 0
        ) > KEY_BYTES * blocks
    assert (value(text, "kvroute_open_tickets") or 0) >= 1  # the hanging request


async def test_draining_is_visible(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s:
        path = f"/admin/replicas/drain?url={stack.urls[1]}"
        async with s.post(stack.url + path, headers=ADMIN) as r:
            assert r.status == 200, await r.text()
    assert by(await scrape(stack), "kvroute_replica_draining", "replica") == {
        stack.urls[0]: 0.0,
        stack.urls[1]: 1.0,
    }


async def test_a_removed_replica_leaves_no_series(stack: Stack) -> None:
    for i in range(4):
        await chat(stack.url, f"question {i}", stream=True)
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)
    gone = stack.urls[1]
    assert gone in await scrape(stack)
    async with (
        aiohttp.ClientSession() as s,
        s.delete(f"{stack.url}/admin/replicas?url={gone}", headers=ADMIN) as r,
    ):
        assert r.status == 200, await r.text()
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)
    text = await scrape(stack)
    assert gone not in text and stack.urls[0] in text  # counters, histograms, gauges alike


def _metrics() -> GatewayMetrics:
    return GatewayMetrics(lambda: [("http://r1", 0, True)])


def test_registered_sources_are_scraped_and_a_broken_one_is_skipped() -> None:
    m = _metrics()
    jobs = {"queued": 2, "running": 1}
    m.register_source("warmup_jobs", lambda: jobs, "Warm-up jobs by state")
    m.register_source(
        "state_sync", lambda: {"connected": 1.0, "lag_seconds": 0.25}, "Redis sync", label="field"
    )

    def broken() -> dict[str, float]:
        raise RuntimeError("redis went away")

    m.register_source("broken", broken, "A source that fails")
    jobs["done"] = 7  # read at every scrape, not at registration
    text = m.render().decode()
    assert by(text, "kvroute_warmup_jobs", "state") == {"queued": 2.0, "running": 1.0, "done": 7.0}
    assert value(text, "kvroute_state_sync", field="lag_seconds") == 0.25
    assert "kvroute_broken" not in text


@pytest.mark.parametrize("name", ["requests", "Bad-Name", "", "warmup jobs"])
def test_a_source_name_must_be_free_and_well_formed(name: str) -> None:
    with pytest.raises(ValueError, match=r"kvroute_|use"):
        _metrics().register_source(name, dict, "x")


async def test_label_sets_do_not_grow_with_requests(stack: Stack) -> None:
    """Labels are bounded: routes, statuses, reasons, tiers and the fleet's replicas, never per request."""
    for i in range(4):
        await chat(stack.url, f"request {i}", stream=i % 2 == 0)
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)  # the replicas' figures after the traffic
    await scrape(stack)  # /metrics itself is counted from its first answer on
    before = {name: set(fam) for name, fam in samples(await scrape(stack)).items()}
    for i in range(8):
        await chat(stack.url, f"another request {i}", stream=i % 2 == 0)
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)
    after = {name: set(fam) for name, fam in samples(await scrape(stack)).items()}
    assert after == before
    replicas = {dict(k).get("replica") for fam in after.values() for k in fam} - {None}
    assert replicas == set(stack.urls)
