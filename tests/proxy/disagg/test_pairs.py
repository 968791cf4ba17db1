"""kvroute in front of a prefill/decode fleet (proxy/disagg): what each server receives, the one stream the
client gets, the prefill's cached tokens, retries as a new pair with a new room, and a client that leaves.

The servers are emulated (pd-contract.md §5, emulator/pd_*.py) and each sits behind a ``Tap`` that records
the bodies it received, the bytes it answered and when (tests/proxy/disagg/taps.py)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from tests.conftest import MODEL, wait_for
from tests.proxy.conftest import ADMIN, SYSTEM
from tests.proxy.disagg.conftest import PdFactory

JSON = {"Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "Explain disaggregation."}]}


async def post(url: str, body: dict[str, object]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.read()


# ---- the pair protocol ---------------------------------------------------------------------------
async def test_both_servers_get_the_clients_body_with_one_room_both_at_once(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1, taps=True)
    raw = orjson.dumps(CHAT | {"max_tokens": 5, "temperature": 0.5})
    async with (
        aiohttp.ClientSession() as http,
        http.post(fleet.url + "/v1/chat/completions", data=raw, headers=JSON) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["x-kvroute-prefill"] == fleet.urls["p0"]
        assert resp.headers["x-kvroute-replica"] == fleet.urls["d0"]
    (prefill_body,), (decode_body,) = fleet.taps["p0"].bodies, fleet.taps["d0"].bodies
    assert prefill_body == decode_body  # the same bytes to both
    sent = orjson.loads(prefill_body)
    port = fleet.gw.gw.fleet.get(fleet.urls["p0"])
    assert port is not None and port.bootstrap_port == fleet.prefills[0].replica.pd.bootstrap_port
    assert sent["bootstrap_host"] == "127.0.0.1" and sent["bootstrap_port"] == port.bootstrap_port
    assert isinstance(sent["bootstrap_room"], int) and 0 < sent["bootstrap_room"] < 2**63
    assert prefill_body.endswith(raw[1:])  # the fields are spliced in front: the client's bytes follow
    assert sorted(fleet.events[:2]) == ["in:d0", "in:p0"]  # both sent before either answered


async def test_batches_get_one_room_per_item_as_sglang_router_sends_them(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1, taps=True)
    status, _ = await post(fleet.url, CHAT | {"max_tokens": 3, "n": 2})
    assert status == 200
    sent = orjson.loads(fleet.taps["d0"].bodies[0])
    assert sent["bootstrap_host"] == ["127.0.0.1"] * 2 and len(set(sent["bootstrap_room"])) == 2
    assert sent["bootstrap_port"] == [fleet.prefills[0].replica.pd.bootstrap_port] * 2


async def test_the_client_gets_the_decodes_stream_byte_for_byte(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1, taps=True)
    body = CHAT | {"max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(fleet.url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        got = await resp.read()
    assert got == fleet.taps["d0"].answers[0] and got.endswith(b"data: [DONE]\n\n")
    assert fleet.taps["p0"].answers[0] != got  # the prefill's own one-token answer is not relayed
    assert b'"completion_tokens":12' in got


async def test_a_repeated_long_prompt_is_cached_on_its_prefill(pd_fleet: PdFactory) -> None:
    """A repeated ~2K-token prompt goes to the prefill that holds it (two prefills to choose from): >= 90%
    of it cached, reported by that prefill (the decode relays the same figure) and learned by the router."""
    fleet = await pd_fleet(prefills=2, decodes=2, policy="cost")
    words = " ".join(f"w{i}" for i in range(1900))
    messages = [{"role": "user", "content": words}]
    async with AsyncOpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=0) as client:
        usages = []
        for _ in range(2):
            chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
            assert chat.usage is not None
            usages.append(chat.usage)
    second = usages[1]
    assert second.prompt_tokens >= 1900
    details = second.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens >= 0.9 * second.prompt_tokens
    text = fleet.gw.metrics()
    served = [u for u in fleet.urls.values() if f'kvroute_cached_tokens_total{{replica="{u}"}}' in text]
    assert len(served) == 1 and served[0] in (fleet.urls["p0"], fleet.urls["p1"])  # the prefill's report
    assert f'kvroute_cached_tokens_total{{replica="{served[0]}"}} {details.cached_tokens}' in text


# ---- retries as a new pair -----------------------------------------------------------------------
async def test_a_failed_decode_is_retried_as_a_new_pair_with_a_new_room(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=2, taps=True, seed=7, breaker_failures=1000)
    await fleet.decodes[0].fault(action="fail", status=503, count=100)
    for i in range(12):
        status, _ = await post(fleet.url, CHAT | {"max_tokens": 2, "seed": i})
        assert status == 200
        if fleet.taps["d0"].bodies:
            break
    (failed,) = fleet.taps["d0"].bodies  # the decode that failed got one request...
    retried = fleet.taps["d1"].bodies[-1]  # ...then the other decode, with the same prefill
    first, second = fleet.taps["p0"].bodies[-2:]
    rooms = [orjson.loads(b)["bootstrap_room"] for b in (failed, first, retried, second)]
    assert rooms[0] == rooms[1] != rooms[2] == rooms[3]  # a new room for the new pair
    assert "gone:p0" in fleet.events  # the first prefill request was given up (aborted)
    assert 'kvroute_pd_pair_failures_total{side="decode"} 1' in fleet.gw.metrics()


async def test_a_failed_prefill_is_retried_on_another_prefill(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=2, decodes=1, taps=True, policy="round_robin", breaker_failures=1000)
    await fleet.prefills[0].fault(action="fail", status=500, count=100)
    for i in range(4):
        status, _ = await post(fleet.url, CHAT | {"max_tokens": 2, "seed": i})
        assert status == 200
    assert fleet.taps["p0"].bodies and len(fleet.taps["p1"].bodies) == 4
    rooms = [orjson.loads(b)["bootstrap_room"] for b in fleet.taps["d0"].bodies]
    assert len(set(rooms)) == len(rooms) == 4 + len(fleet.taps["p0"].bodies)
    assert 'kvroute_pd_pair_failures_total{side="prefill"}' in fleet.gw.metrics()


async def test_no_decode_server_is_a_503_naming_the_role(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1)
    for d in fleet.decodes:
        async with aiohttp.ClientSession() as http:
            url = fleet.url + "/admin/replicas/drain"
            async with http.post(url, json={"url": d.url}, headers=ADMIN) as resp:
                assert resp.status == 200
    status, body = await post(fleet.url, CHAT | {"max_tokens": 2})
    assert status == 503 and b"no healthy decode server" in body


# ---- a client that leaves ------------------------------------------------------------------------
async def test_a_client_that_leaves_before_its_first_byte_aborts_both_requests(pd_fleet: PdFactory) -> None:
    """The decode server hangs (it never admits the request), so the prefill holds the room: the client
    leaves, and both upstream connections are closed at once."""
    fleet = await pd_fleet(prefills=1, decodes=1, taps=True)
    await fleet.decodes[0].fault(action="hang", count=1)
    body = CHAT | {"max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(http.post(fleet.url + "/v1/chat/completions", json=body))
        await wait_for(lambda: {"in:d0", "in:p0"} <= set(fleet.events))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await wait_for(lambda: {"gone:p0", "gone:d0"} <= set(fleet.events))
    await wait_for(lambda: 'kvroute_client_disconnects_total{route="chat"} 1' in fleet.gw.metrics())
    gw = fleet.gw.gw
    await wait_for(lambda: all(r.inflight_requests == 0 for r in gw.fleet.replicas()))
    rooms = fleet.prefills[0].replica.pd
    assert rooms.bootstrap_reqs == 0  # the prefill released the room it held
