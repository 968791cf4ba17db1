"""Relaying: exact bytes and headers, SSE chunking, retries, mid-stream failure, client disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp
import orjson
import pytest

from proxy.context import GATEWAY
from routing.pipeline import Outcome, Policy
from routing.types import Candidate, Decision, RoutingRequest
from tests.proxy.conftest import Stack, StackFactory, wait_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
# Deliberately odd formatting and a kvroute-unknown field: the replica must get these exact bytes.
ODD_BODY = b'{ "messages":[{"content":"hi","role":"user"}],\n  "model" : "fake-model", "zz_extra": [1,2.50]}'


async def _post(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body, headers=headers or {}) as r:
        return r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()}


async def test_request_bytes_reach_the_replica_unchanged(stack: Stack) -> None:
    status, _, _ = await _post(
        stack.url, "/v1/chat/completions", ODD_BODY, {"Content-Type": "application/json"}
    )
    assert status == 200
    assert [b for r in stack.replicas for b in r.bodies] == [ODD_BODY]


@pytest.mark.parametrize("stream", [False, True])
async def test_response_bytes_equal_the_direct_response(stack: Stack, stream: bool) -> None:
    body = orjson.dumps({**CHAT, "stream": stream, "stream_options": {"include_usage": True}, "rid": "r1"})
    direct = [await _post(u, "/v1/chat/completions", body) for u in stack.urls]
    via = [await _post(stack.url, "/v1/chat/completions", body) for _ in stack.urls]
    assert {d[1] for d in direct} == {v[1] for v in via}
    assert all(v[2]["content-type"] == direct[0][2]["content-type"] for v in via)


async def test_request_id_forwarded_and_returned(stack: Stack) -> None:
    _, _, headers = await _post(
        stack.url, "/v1/chat/completions", orjson.dumps(CHAT), {"x-request-id": "abc-123"}
    )
    assert headers["x-request-id"] == "abc-123"
    assert headers["x-kvroute-replica"] in stack.urls
    assert [h.get("x-request-id") for r in stack.replicas for h in r.headers] == ["abc-123"]
    _, _, generated = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert len(generated["x-request-id"]) == 32


async def test_request_id_headers_can_be_turned_off(stack_factory: StackFactory) -> None:
    stack = await stack_factory(no_request_id_headers=True)
    _, _, headers = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert "x-request-id" not in headers and "x-kvroute-replica" not in headers
    assert all("x-request-id" not in h for r in stack.replicas for h in r.headers)


async def test_usage_read_from_stream_feeds_metrics(stack: Stack) -> None:
    body = orjson.dumps({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    status, raw, _ = await _post(stack.url, "/v1/chat/completions", body)
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    text = stack.app[GATEWAY].metrics.render().decode()
    assert "kvroute_cached_tokens_total{replica=" in text
    prompt = orjson.loads(raw.split(b"data: ")[-2])["usage"]["prompt_tokens"]
    assert f'kvroute_prompt_tokens_total{{replica="{stack.urls[0]}"}} {float(prompt)}' in text or (
        f'kvroute_prompt_tokens_total{{replica="{stack.urls[1]}"}} {float(prompt)}' in text
    )


async def test_sse_chunks_arrive_before_the_stream_ends(stack: Stack) -> None:
    for r in stack.replicas:
        r.chunks, r.chunk_delay = 3, 0.3
    body = orjson.dumps({**CHAT, "stream": True})
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", data=body) as r:
        first = await r.content.readuntil(b"\n\n")
        done = r.content.at_eof()
        rest = await r.read()
    assert first.startswith(b"data: ") and not done and rest.endswith(b"[DONE]\n\n")


@pytest.mark.parametrize("fault", ["status", "reset"])
async def test_failure_before_first_byte_is_retried_on_another_replica(stack: Stack, fault: str) -> None:
    first = min(range(2), key=lambda i: stack.urls[i])  # round robin starts with the lowest id
    if fault == "status":
        stack.replicas[first].fail_status = [503]
    else:
        stack.replicas[first].reset_next = 1
    status, body, headers = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert status == 200, body
    assert [r.served for r in stack.replicas] == [int(i != first) for i in range(2)]
    assert headers["x-kvroute-replica"] == stack.urls[1 - first]
    assert "kvroute_retries_total" in stack.app[GATEWAY].metrics.render().decode()


async def test_client_error_from_replica_is_relayed_not_retried(stack: Stack) -> None:
    for r in stack.replicas:
        r.fail_status = [400]
    status, body, _ = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert status == 400 and orjson.loads(body)["message"] == "injected 400"
    assert sum(len(r.bodies) for r in stack.replicas) == 1


async def test_retries_are_bounded(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=3, retries=1)
    for r in stack.replicas:
        r.fail_status = [503]
    status, body, _ = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert status == 503 and orjson.loads(body)["message"] == "injected 503"  # the last answer, relayed
    assert sum(len(r.bodies) for r in stack.replicas) == 2


async def test_mid_stream_failure_sends_one_error_event_and_no_done(stack: Stack) -> None:
    for r in stack.replicas:
        r.cut_after = 2
    body = orjson.dumps({**CHAT, "stream": True})
    status, raw, _ = await _post(stack.url, "/v1/chat/completions", body)
    events = [e for e in raw.split(b"\n\n") if e]
    assert status == 200 and len(events) == 3
    assert orjson.loads(events[-1][len(b"data: ") :])["error"]["type"] == "upstream_error"
    assert b"[DONE]" not in raw
    assert "kvroute_stream_errors_total{replica=" in stack.app[GATEWAY].metrics.render().decode()


async def test_client_disconnect_mid_stream_aborts_upstream(stack: Stack) -> None:
    for r in stack.replicas:
        r.chunks, r.chunk_delay = 50, 0.05
    body = orjson.dumps({**CHAT, "stream": True, "rid": "rid-abc"})
    async with aiohttp.ClientSession() as s:
        r = await s.post(stack.url + "/v1/chat/completions", data=body)
        await r.content.readuntil(b"\n\n")
        r.close()
    await wait_for(lambda: any(rep.aborts for rep in stack.replicas), timeout_s=2.0)
    assert [a for rep in stack.replicas for a in rep.aborts] == ["rid-abc"]
    await wait_for(lambda: sum(rep.cancelled for rep in stack.replicas) == 1, timeout_s=2.0)
    await wait_for(lambda: all(r.inflight_requests == 0 for r in stack.app[GATEWAY].fleet.replicas()))


async def test_client_disconnect_while_waiting_closes_upstream(stack: Stack) -> None:
    for r in stack.replicas:
        r.hang = True
    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(s.post(stack.url + "/v1/chat/completions", data=orjson.dumps(CHAT)))
        await wait_for(lambda: sum(len(r.bodies) for r in stack.replicas) == 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await wait_for(lambda: sum(rep.cancelled for rep in stack.replicas) == 1, timeout_s=2.0)
    await wait_for(lambda: all(r.inflight_requests == 0 for r in stack.app[GATEWAY].fleet.replicas()))


async def test_generate_and_passthrough(stack: Stack) -> None:
    status, body, _ = await _post(
        stack.url, "/generate", orjson.dumps({"text": "abc", "sampling_params": {}})
    )
    assert status == 200 and orjson.loads(body)["meta_info"]["cached_tokens"] == 3
    status, body, _ = await _post(stack.url, "/v1/embeddings", b'{"model":"fake-model","input":"x"}')
    assert status == 200 and orjson.loads(body) == {"echo": 34, "path": "/v1/embeddings", "method": "POST"}
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/echo?q=1") as r:
        assert r.status == 200 and (await r.json())["method"] == "GET"


async def test_sdk_sees_mid_stream_failure_as_an_error(stack: Stack) -> None:
    import openai

    for r in stack.replicas:
        r.cut_after = 2
    async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="fake-model", messages=CHAT["messages"], stream=True
        )  # type: ignore[arg-type]
        got: list[str] = []
        with pytest.raises(openai.APIError, match="mid-response"):
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content or "")
    assert got == ["tok0 ", "tok1 "]


async def test_flush_cache_fans_out(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/flush_cache") as r:
        doc = await r.json()
    assert r.status == 200 and doc["flushed"] is True and set(doc["replicas"]) == set(stack.urls)
    assert [rep.flushes for rep in stack.replicas] == [1, 1]


class RecordingPolicy:
    """Wraps the gateway's policy and keeps every Outcome it is fed."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name, self.outcomes = inner, inner.name, list[Outcome]()

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision:
        return self.inner.route(req, cands)

    def observe(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


async def test_outcomes_fed_back_with_usage_and_ttft(stack: Stack) -> None:
    gw = stack.app[GATEWAY]
    rec = RecordingPolicy(gw.policy)
    gw.policy = rec
    stream = orjson.dumps({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    for body in (orjson.dumps(CHAT), stream):
        status, _, _ = await _post(stack.url, "/v1/chat/completions", body)
        assert status == 200
    plain, streamed = rec.outcomes
    assert plain.ok and plain.ttft_s is None and plain.prompt_tokens is not None
    assert plain.cached_tokens == plain.prompt_tokens // 2  # the fake reports half as cached
    assert streamed.ok and streamed.ttft_s is not None and streamed.ttft_s > 0
    assert streamed.cached_tokens == plain.cached_tokens and streamed.decision.replica in stack.urls
    for r in stack.replicas:
        r.fail_status = [400]
    await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert rec.outcomes[-1].ok is False and rec.outcomes[-1].cached_tokens is None


async def test_single_replica_gets_a_second_try_after_a_reset(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, retries=1)
    stack.replicas[0].reset_next = 1
    status, _, _ = await _post(stack.url, "/v1/chat/completions", orjson.dumps(CHAT))
    assert status == 200 and stack.replicas[0].served == 1 and len(stack.replicas[0].bodies) == 2
