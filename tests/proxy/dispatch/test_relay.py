"""Relaying: exact bytes and headers, SSE chunking, retries, mid-stream failure, client disconnect.

The replicas are real emulators: what reached them is read from their request log (GET /_emu/requests:
path, headers, body SHA-256), failures are armed through POST /_emu/faults, aborts and engine state come
from GET /_emu/state.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from routing.ledger import Ticket
from routing.types import Report
from tests.conftest import sha256
from tests.proxy.conftest import ADMIN, MODEL, SYSTEM, Stack, StackFactory, post, wait_for

JSON = {"Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
SDK_MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
LONG_CHAT = {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "hi"}]}
# Deliberately odd formatting and a kvroute-unknown field: the replica must get these exact bytes.
ODD_BODY = b'{ "messages":[{"content":"hi","role":"user"}],\n  "model" : "emu-model", "zz_extra": [1,2.50]}'
_VOLATILE = re.compile(rb'"(created|e2e_latency)":\s*[0-9.e+-]+')


def _stable(body: bytes) -> bytes:
    """The body with its wall-clock fields zeroed (they differ between two identical requests)."""
    return _VOLATILE.sub(rb'"\1":0', body)


async def test_request_bytes_reach_the_replica_unchanged(stack: Stack) -> None:
    status, _, _ = await post(stack.url, "/v1/chat/completions", ODD_BODY, JSON)
    assert status == 200
    seen = await stack.generations()
    assert [(e["body_sha256"], e["body_bytes"], e["status"]) for e in seen] == [
        (sha256(ODD_BODY), len(ODD_BODY), 200)
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_response_bytes_equal_the_direct_response(stack: Stack, stream: bool) -> None:
    opts = {"stream": stream, "stream_options": {"include_usage": True}, "rid": "r1", "max_tokens": 6}
    body = orjson.dumps({**LONG_CHAT, **opts})
    direct = {}
    for u in stack.urls:
        await stack.flush()
        direct[u] = await post(u, "/v1/chat/completions", body, JSON)
    via = []
    for _ in stack.urls:
        await stack.flush()
        via.append(await post(stack.url, "/v1/chat/completions", body, JSON))
    assert {v[2]["x-kvroute-replica"] for v in via} == set(stack.urls)
    for status, raw, headers in via:
        d_status, d_raw, d_headers = direct[headers["x-kvroute-replica"]]
        assert status == d_status == 200 and _stable(raw) == _stable(d_raw)
        assert headers["content-type"] == d_headers["content-type"]
    assert via[0][1].endswith(b"data: [DONE]\n\n") == stream


async def test_request_id_forwarded_and_returned(stack: Stack) -> None:
    _, _, headers = await post(
        stack.url, "/v1/chat/completions", orjson.dumps(CHAT), {**JSON, "x-request-id": "abc-123"}
    )
    assert headers["x-request-id"] == "abc-123"
    assert headers["x-kvroute-replica"] in stack.urls
    assert [e["headers"].get("x-request-id") for e in await stack.generations()] == ["abc-123"]
    _, _, generated = await post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT), JSON)
    assert len(generated["x-request-id"]) == 32
    forwarded = [e["headers"].get("x-request-id") for e in await stack.generations()]
    assert sorted(forwarded) == sorted(["abc-123", generated["x-request-id"]])  # the generated id, forwarded


async def test_request_id_headers_can_be_turned_off(stack_factory: StackFactory) -> None:
    stack = await stack_factory(no_request_id_headers=True)
    _, _, headers = await post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT), JSON)
    assert "x-request-id" not in headers and "x-kvroute-replica" not in headers
    seen = await stack.generations()
    assert len(seen) == 1 and all("x-request-id" not in e["headers"] for e in seen)


async def test_usage_read_from_stream_feeds_metrics(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    body = orjson.dumps({**LONG_CHAT, "stream": True, "stream_options": {"include_usage": True}})
    usages = []
    for _ in range(2):  # cold, then warm
        status, raw, _ = await post(stack.url, "/v1/chat/completions", body, JSON)
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        usages.append(orjson.loads(raw.split(b"data: ")[-2])["usage"])
    text, replica = stack.metrics(), stack.urls[0]
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
    assert usages[0]["prompt_tokens_details"] is None and cached > 0
    assert f'kvroute_prompt_tokens_total{{replica="{replica}"}} {float(prompt)}' in text
    assert f'kvroute_cached_tokens_total{{replica="{replica}"}} {float(cached)}' in text


async def test_sse_chunks_arrive_before_the_stream_ends(stack: Stack) -> None:
    """The first event reaches the client while the replica is still generating (no buffering)."""
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 4000})  # ~0.3 s of decode at this scale
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/chat/completions", data=body, headers=JSON) as r,
    ):
        first = await r.content.readuntil(b"\n\n")
        emu = stack.replica(r.headers["x-kvroute-replica"])
        still_running = (await emu.state())["queue"]["running"]
        rest = await r.read()
    assert first.startswith(b"data: ") and still_running == 1 and rest.endswith(b"[DONE]\n\n")
    assert [e["outcome"] for e in await emu.generations()] == ["answered"]


@pytest.mark.parametrize("fault", ["status", "reset"])
async def test_failure_before_first_byte_is_retried_on_another_replica(stack: Stack, fault: str) -> None:
    first = min(range(2), key=lambda i: stack.urls[i])  # round robin starts with the lowest id
    if fault == "status":
        await stack.replicas[first].fault(action="fail", status=503)
    else:
        await stack.replicas[first].fault(action="reset")
    status, body, headers = await post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT), JSON)
    assert status == 200, body
    assert [await r.served() for r in stack.replicas] == [int(i != first) for i in range(2)]
    assert headers["x-kvroute-replica"] == stack.urls[1 - first]
    failed = await stack.replicas[first].generations()
    assert [(e["outcome"], e["status"]) for e in failed] == [
        ("answered", 503) if fault == "status" else ("reset", None)
    ]
    assert "kvroute_retries_total" in stack.metrics()


async def test_client_error_from_replica_is_relayed_not_retried(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="fail", status=400)
    status, body, _ = await post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT), JSON)
    err = orjson.loads(body)["error"]  # SGLang's flat error, in OpenAI's shape
    assert status == 400 and err["message"] == "Emulated fault." and err["code"] == 400
    assert len(await stack.generations()) == 1


async def test_retries_are_bounded(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=3, retries=1)
    for r in stack.replicas:
        await r.fault(action="fail", status=503)
    status, body, _ = await post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT), JSON)
    err = orjson.loads(body)["error"]
    assert status == 503 and err["message"] == "Emulated fault." and err["code"] == 503  # the last answer
    assert [e["status"] for e in await stack.generations()] == [503, 503]


async def test_mid_stream_failure_sends_one_error_event_and_no_done(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="cut_stream", after_chunks=2)
    body = orjson.dumps({**CHAT, "stream": True, "rid": "cut-1"})
    status, raw, _ = await post(stack.url, "/v1/chat/completions", body, JSON)
    events = [e for e in raw.split(b"\n\n") if e]
    assert status == 200 and len(events) == 3
    assert orjson.loads(events[-1][len(b"data: ") :])["error"]["type"] == "upstream_error"
    assert b"[DONE]" not in raw
    assert "kvroute_stream_errors_total{replica=" in stack.metrics()
    await stack.replicas[0].fault(action="clear")  # armed on both, used on one
    _, whole, _ = await post(stack.urls[0], "/v1/chat/completions", body, JSON)
    direct = [e for e in whole.split(b"\n\n") if e]
    assert [_stable(e) for e in events[:2]] == [_stable(e) for e in direct[:2]]  # relayed as sent


async def test_client_disconnect_mid_stream_aborts_upstream(stack: Stack) -> None:
    body = orjson.dumps({**CHAT, "stream": True, "rid": "rid-abc", "max_tokens": 20_000})
    async with aiohttp.ClientSession() as s:
        r = await s.post(stack.url + "/v1/chat/completions", data=body, headers=JSON)
        await r.content.readuntil(b"\n\n")
        emu = stack.replica(r.headers["x-kvroute-replica"])
        r.close()

    async def aborted() -> bool:
        state = await emu.state()
        return bool(state["abort_requests"]["rids"] == ["rid-abc"] and state["queue"]["running"] == 0)

    await wait_for(aborted, timeout_s=2.0)
    assert (await emu.state())["aborted_total"] == 1  # the engine stopped it once
    assert [e["outcome"] for e in await emu.generations()] == ["cancelled"]  # its connection was closed
    await wait_for(lambda: all(r.inflight_requests == 0 for r in stack.gw.fleet.replicas()))


async def test_client_disconnect_while_waiting_closes_upstream(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="hang")

    async def outcomes() -> list[str]:
        return [e["outcome"] for e in await stack.generations()]

    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(
            s.post(stack.url + "/v1/chat/completions", data=orjson.dumps(CHAT), headers=JSON)
        )

        async def arrived() -> bool:
            return await outcomes() == ["pending"]

        await wait_for(arrived)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def closed() -> bool:
        return await outcomes() == ["cancelled"]

    await wait_for(closed, timeout_s=2.0)
    await wait_for(lambda: all(r.inflight_requests == 0 for r in stack.gw.fleet.replicas()))


async def test_generate_and_passthrough(stack: Stack) -> None:
    gen = orjson.dumps({"text": "abc", "sampling_params": {"max_new_tokens": 4}, "rid": "g1"})
    await stack.flush()
    status, body, headers = await post(stack.url, "/generate", gen, JSON)
    assert status == 200 and orjson.loads(body)["meta_info"]["completion_tokens"] == 4
    await stack.flush()
    _, direct, _ = await post(headers["x-kvroute-replica"], "/generate", gen, JSON)
    assert _stable(body) == _stable(direct)
    # a pass-through path on the allowlist: routed and relayed as is (method, path, body)
    tok = b'{"model":"emu-model","prompt":"hello world"}'
    status, body, headers = await post(stack.url, "/v1/tokenize", tok, JSON)
    _, direct, _ = await post(headers["x-kvroute-replica"], "/v1/tokenize", tok, JSON)
    assert status == 200 and body == direct and orjson.loads(body)["count"] > 0
    logged = await stack.replica(headers["x-kvroute-replica"]).requests("/v1/tokenize")
    assert [(e["method"], e["body_sha256"]) for e in logged] == [("POST", sha256(tok))] * 2
    # one replica's load view is not the fleet's: off the allowlist (proxy/front/passthrough.py)
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/loads?format=prometheus") as r:
        assert r.status == 404


async def test_sdk_sees_mid_stream_failure_as_an_error(stack: Stack) -> None:
    import openai

    for r in stack.replicas:
        await r.fault(action="cut_stream", after_chunks=2)
    async with (
        openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0) as client,
        openai.AsyncOpenAI(base_url=stack.urls[0] + "/v1", api_key="k", max_retries=0) as direct,
    ):
        stream = await client.chat.completions.create(model=MODEL, messages=SDK_MESSAGES, stream=True)
        got: list[str] = []
        with pytest.raises(openai.APIError, match="mid-response"):
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content or "")
        await stack.replicas[0].fault(action="clear")
        whole = await direct.chat.completions.create(model=MODEL, messages=SDK_MESSAGES, stream=True)
        expected = [chunk.choices[0].delta.content or "" async for chunk in whole if chunk.choices]
    assert got == expected[:2] and "".join(got)


async def test_flush_cache_fans_out(stack: Stack) -> None:
    for _ in stack.replicas:  # round robin: one request each, long enough to fill cache pages
        status, _, _ = await post(stack.url, "/v1/chat/completions", orjson.dumps(LONG_CHAT), JSON)
        assert status == 200
    assert all([(await r.state())["cache"]["gpu_cached"] > 0 for r in stack.replicas])
    model = stack.gw.router.cache
    assert all(len(t.gpu) > 0 for t in map(model.tiers, stack.urls) if t is not None)
    async with aiohttp.ClientSession() as s:
        for method in ("GET", "PUT"):  # a flush wipes every replica: POST only
            async with s.request(method, stack.url + "/flush_cache", headers=ADMIN) as r:
                assert r.status == 405 and (await r.json())["error"]["type"] == "invalid_request_error"
        async with s.post(stack.url + "/flush_cache") as r:  # ...and for the admin only
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
        assert [await r.requests("/flush_cache") for r in stack.replicas] == [[], []]
        async with s.post(stack.url + "/flush_cache", headers=ADMIN) as r:
            doc = await r.json()
    assert r.status == 200 and doc["flushed"] is True and set(doc["replicas"]) == set(stack.urls)
    assert [[e["status"] for e in await r.requests("/flush_cache")] for r in stack.replicas] == [[200], [200]]
    assert [(await r.state())["cache"]["gpu_cached"] for r in stack.replicas] == [0, 0]
    # the model follows: GPU and host gone (storage would stay), the replicas still known
    assert [len(t.gpu) for t in map(model.tiers, stack.urls) if t is not None] == [0, 0]


def record_reports(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Ticket, Report]]:
    """Every (ticket, report) the gateway finishes, in order (the Router still learns from them)."""
    seen: list[tuple[Ticket, Report]] = []
    finish = stack.gw.router.finish

    def recording(ticket: Ticket, report: Report) -> None:
        seen.append((ticket, report))
        finish(ticket, report)

    monkeypatch.setattr(stack.gw.router, "finish", recording)
    return seen


async def test_reports_fed_back_with_usage_and_ttft(
    stack_factory: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = await stack_factory(n=1)
    seen = record_reports(stack, monkeypatch)
    plain = orjson.dumps(LONG_CHAT)
    stream = orjson.dumps({**LONG_CHAT, "stream": True, "stream_options": {"include_usage": True}})
    bodies = []
    for body in (plain, plain, stream):  # cold, then warm twice
        status, raw, _ = await post(stack.url, "/v1/chat/completions", body, JSON)
        assert status == 200
        bodies.append(raw)
    (_, cold), (_, warm), (ticket, streamed) = seen
    usage = orjson.loads(bodies[1])["usage"]
    assert cold.ok and cold.ttft_s is None and cold.prompt_tokens == usage["prompt_tokens"]
    assert cold.cached_tokens == 0  # null prompt_tokens_details on a cache-report replica means 0 cached
    assert warm.ok and warm.ttft_s is None and warm.prompt_tokens == usage["prompt_tokens"]
    assert warm.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"] > 0  # what the replica said
    assert streamed.ok and streamed.ttft_s is not None and streamed.ttft_s > 0
    assert streamed.cached_tokens == warm.cached_tokens and ticket.replica in stack.urls
    assert warm.cached_tokens is not None
    assert (await stack.replicas[0].state())["cached_tokens_total"] == 2 * warm.cached_tokens
    await stack.replicas[0].fault(action="fail", status=400)
    await post(stack.url, "/v1/chat/completions", plain, JSON)
    assert seen[-1][1].ok is False and seen[-1][1].cached_tokens is None


async def test_single_replica_gets_a_second_try_after_a_reset(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, retries=1)
    await stack.replicas[0].fault(action="reset")
    body = orjson.dumps(CHAT)
    status, _, _ = await post(stack.url, "/v1/chat/completions", body, JSON)
    assert status == 200 and await stack.replicas[0].served() == 1
    seen = await stack.replicas[0].generations()
    assert [(e["outcome"], e["body_sha256"]) for e in seen] == [
        ("reset", sha256(body)),
        ("answered", sha256(body)),
    ]
