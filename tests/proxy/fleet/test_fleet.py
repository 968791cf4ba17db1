"""Fleet: replica info by the contract's recipe, health leave/return, restarts, load, the admin API."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy.fleet.replica_info import STORAGE_UNBOUNDED, parse_replica_info
from tests.proxy.conftest import ADMIN, EMU_FLAGS, MODEL, SYSTEM, Stack, StackFactory, wait_for

JSON = {"Content-Type": "application/json"}
STREAM = orjson.dumps({"model": MODEL, "prompt": "x", "stream": True, "max_tokens": 4})
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_replica_info_recipe() -> None:
    info = {
        "served_model_name": "m",
        "page_size": 16,
        "max_total_num_tokens": 1000,
        "enable_hierarchical_cache": True,
        "hicache_ratio": 2.0,
        "hicache_size": 0,
        "hicache_write_policy": "write_back",
        "startup_time": 5.0,
        "internal_states": [{"memory_usage": {"token_capacity": 1001, "kvcache": 2.0}}],
        "max_running_requests": 8,
    }
    r = parse_replica_info(info, {"architectures": ["LlamaForCausalLM"]})
    assert (r.served_model, r.gpu_tokens, r.page_size, r.write_policy) == ("m", 1001, 16, "write_back")
    assert r.host_tokens == 2016 + 16  # floor(1001 x 2) = 2002 → page-rounded 2016, + 1 page
    assert (r.hybrid, r.storage_tokens, r.started_at, r.max_running_requests) == (False, 0, 5.0, 8)
    sized = parse_replica_info(
        {**info, "hicache_size": 4, "hicache_storage_backend": "file"},
        {"architectures": ["Qwen3NextForCausalLM"]},
    )
    assert (
        sized.host_tokens == int(4e9 / (2.0 * 2**30 / 1001))
        and sized.hybrid
        and sized.storage_tokens == STORAGE_UNBOUNDED
    )
    off = parse_replica_info({"model_path": "/p", "max_total_num_tokens": 10}, {})
    assert (off.served_model, off.gpu_tokens, off.host_tokens, off.write_policy) == ("/p", 10, 0, None)


async def test_failing_replica_leaves_the_pool_and_returns(stack: Stack) -> None:
    fleet = stack.gw.fleet
    await stack.replicas[0].fault(action="unhealthy")  # /health answers 503 until cleared
    await wait_for(lambda: not fleet.get(stack.urls[0]).healthy)  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
                assert r.status == 200 and r.headers["x-kvroute-replica"] == stack.urls[1]
    assert await stack.replicas[0].generations() == []
    await stack.replicas[0].fault(action="clear")
    await wait_for(lambda: fleet.get(stack.urls[0]).healthy)  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as s:
        seen = set()
        for _ in range(4):
            async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
                assert r.status == 200
                seen.add(r.headers["x-kvroute-replica"])
    assert seen == set(stack.urls)
    assert [len(await r.generations()) for r in stack.replicas] == [2, 6]


async def test_restart_is_detected_and_the_index_told(stack: Stack) -> None:
    gw = stack.gw
    restarted: list[str] = []
    removed: list[str] = []
    gw.fleet.restarts._restart, gw.fleet._on_removed = restarted.append, removed.append
    before = (await stack.replicas[0].state())["startup_time"]
    await stack.replicas[0].fault(action="restart")  # new startup_time, GPU and host tiers lost
    after = (await stack.replicas[0].state())["startup_time"]
    assert after != before
    await wait_for(lambda: restarted == [stack.urls[0]], timeout_s=5.0)  # info refresh every 12 checks
    assert gw.fleet.get(stack.urls[0]).info.started_at == after  # type: ignore[union-attr]
    assert removed == []


async def test_a_health_flap_without_a_restart_keeps_what_the_replica_holds(stack: Stack) -> None:
    """Same start time after the flap: the process (and its cache) survived; only removal forgets."""
    gw = stack.gw
    long_chat = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "word " * 800}], "max_tokens": 2}
    )
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/chat/completions", data=long_chat, headers=JSON) as r,
    ):
        assert r.status == 200
        served = r.headers["x-kvroute-replica"]
    tiers = gw.router.cache.tiers(served)
    held = len(tiers.gpu)
    assert held > 0
    await stack.replicas[stack.urls.index(served)].fault(action="unhealthy")
    await wait_for(lambda: not gw.fleet.get(served).healthy)  # type: ignore[union-attr]
    await stack.replicas[stack.urls.index(served)].fault(action="clear")
    await wait_for(lambda: gw.fleet.get(served).healthy)  # type: ignore[union-attr]
    assert len(tiers.gpu) == held
    assert gw.fleet.remove(served)
    assert gw.router.cache.tiers(served) is None


async def test_status_reports_replicas_load_and_config(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        doc = await r.json()
    assert doc["policy"] == "round_robin" and doc["healthy_replicas"] == 2 and doc["models"] == [MODEL]
    assert {rep["id"] for rep in doc["replicas"]} == set(stack.urls)
    # page 16, 100K GPU tokens, hicache_ratio 2 → the replica's own host pool size, by the contract's recipe
    host = stack.replicas[0].replica.cfg.host_tokens
    assert doc["replicas"][0]["host_tokens"] == 200_016 == host
    assert doc["replicas"][0]["gpu_tokens"] == 100_000 and doc["replicas"][0]["page_size"] == 16
    assert doc["replicas"][0]["write_policy"] == "write_back"
    assert "admin_key" in doc["config"]
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/health") as r:
        assert r.status == 200


async def test_metrics_endpoint(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
            assert r.status == 200
        async with s.post(stack.url + "/v1/completions", data=STREAM, headers=JSON) as r:
            assert r.status == 200 and (await r.read()).endswith(b"[DONE]\n\n")
        async with s.get(stack.url + "/metrics", headers=ADMIN) as r:
            text = await r.text()
    assert 'kvroute_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'kvroute_decisions_total{policy="round_robin",reason="round_robin"} 2.0' in text
    assert 'kvroute_ttft_seconds_count{route="completions"} 1.0' in text  # streamed requests only
    assert text.count("kvroute_replica_ttft_seconds_count{replica=") == 1  # and per replica
    assert "kvroute_ttft_seconds_bucket" in text and "kvroute_inflight_requests{replica=" in text


async def test_admin_api(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, admin_key="adm")
    extra = await stack.emulators(*EMU_FLAGS)
    extra_url = extra.url
    auth = {"Authorization": "Bearer adm"}
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.url + "/admin/replicas") as r:
            assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
        async with s.post(
            stack.url + "/admin/replicas", json={"url": extra_url}, headers={"Authorization": "Bearer x"}
        ) as r:
            assert r.status == 401
        async with s.post(stack.url + "/admin/replicas", json={"url": "nope"}, headers=auth) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "url"
        async with s.post(stack.url + "/admin/replicas", json={"url": extra_url}, headers=auth) as r:
            assert r.status == 201 and (await r.json())["replica"]["healthy"] is True
        for _ in range(4):
            async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
                assert r.status == 200
        assert (
            await extra.served() == 2 and await stack.replicas[0].served() == 2
        )  # the added one gets traffic
        async with s.post(
            stack.url + "/admin/replicas/drain", json={"url": stack.urls[0]}, headers=auth
        ) as r:
            assert r.status == 200 and (await r.json())["replica"]["draining"] is True
        for _ in range(2):
            async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
                assert r.headers["x-kvroute-replica"] == extra_url
        assert await extra.served() == 4 and await stack.replicas[0].served() == 2
        async with s.delete(stack.url + "/admin/replicas", json={"url": extra_url}, headers=auth) as r:
            assert r.status == 200
        async with s.delete(stack.url + "/admin/replicas", json={"url": extra_url}, headers=auth) as r:
            assert r.status == 404
        async with s.get(stack.url + "/admin/replicas", headers=auth) as r:
            assert [x["id"] for x in (await r.json())["replicas"]] == [stack.urls[0]]
        async with s.post(stack.url + "/v1/chat/completions", data=CHAT, headers=JSON) as r:
            assert r.status == 503  # the only replica left is draining
    assert await extra.served() == 4 and await stack.replicas[0].served() == 2


async def test_admin_endpoints_disabled_without_key(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, admin_key=None)
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.url + "/admin/replicas") as r:
            assert r.status == 403
        async with s.post(stack.url + "/flush_cache") as r:  # no key configured: nobody may flush
            assert r.status == 403 and (await r.json())["error"]["type"] == "permission_error"
    assert await stack.replicas[0].requests("/flush_cache") == []


async def test_load_is_tracked_and_released(stack: Stack) -> None:
    import asyncio

    for r in stack.replicas:
        await r.fault(action="hang")  # accepted, never answered
    fleet = stack.gw.fleet
    body = orjson.dumps({"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(s.post(stack.url + "/v1/chat/completions", data=body, headers=JSON))
        await wait_for(lambda: sum(r.inflight_requests for r in fleet.replicas()) == 1)
        states = fleet.snapshot(None)
        assert sum(st.inflight_prefill_tokens for st in states) > 0
        assert sum(st.inflight_prefill_s for st in states) > 0  # predicted prefill work, in seconds
        await wait_for(lambda: _outcomes(stack, ["pending"]))  # the replica holds it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await wait_for(
        lambda: sum(s.inflight_requests + s.inflight_prefill_tokens for s in fleet.snapshot(None)) == 0
    )
    await wait_for(lambda: _outcomes(stack, ["cancelled"]))  # the gateway closed the upstream connection


async def _outcomes(stack: Stack, expected: list[str]) -> bool:
    return [e["outcome"] for e in await stack.generations()] == expected


async def test_queued_prefill_is_priced_at_the_current_learned_rate(stack: Stack) -> None:
    """A rate learned after a request was routed reprices its queued prefill (proxy/fleet/load.py)."""
    import asyncio

    for r in stack.replicas:
        await r.fault(action="hang")  # accepted, never answered: it stays queued
    long = {"role": "user", "content": "a long new question " * 4000}  # ~5 s at the start rate
    body = orjson.dumps({"model": MODEL, "messages": [SYSTEM, long]})
    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(s.post(stack.url + "/v1/chat/completions", data=body, headers=JSON))
        try:
            await wait_for(lambda: sum(r.inflight_requests for r in stack.gw.fleet.replicas()) == 1)
            busy = next(r for r in stack.gw.fleet.replicas() if r.inflight_requests)
            rates = stack.gw.router.rates.get(busy.id)
            before = busy.state().inflight_prefill_s
            assert before > 2.0
            rates.prefill_tokens_per_s *= 10  # as if the replica had shown itself ten times faster
            assert busy.state().inflight_prefill_s < before / 5
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    ("info", "in_order"),
    [
        ({}, True),  # SGLang's defaults: fcfs, one scheduler
        ({"schedule_policy": "fcfs", "dp_size": 1}, True),
        ({"schedule_policy": "lpm"}, False),  # longest prefix first
        ({"dp_size": 2}, False),  # a queue per rank
        ({"enable_priority_scheduling": True}, False),
    ],
)
def test_a_replica_starts_prefills_in_send_order_only_with_one_fcfs_queue(
    info: dict[str, object], in_order: bool
) -> None:
    parsed = parse_replica_info(
        {"max_total_num_tokens": 1000, **info}, {"architectures": ["LlamaForCausalLM"]}
    )
    assert parsed.in_send_order is in_order
