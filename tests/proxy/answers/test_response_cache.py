"""The exact-response cache in memory, end to end: kvroute (``response_cache="memory"``) in front of an
emulated SGLang replica. Whether a replica computed an answer is read from the replica's own request
log (``/_emu/requests``); a direct answer (``Cache-Control: no-store``, or the replica itself) is the
reference every hit is compared with (the emulator's output is deterministic per prompt)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai
import orjson
import pytest

from tests.proxy.cache_helpers import (
    CHAT_PATH,
    TEXT_PATH,
    ask,
    chat,
    completion,
    counts,
    events,
    kinds,
    stable,
    streamed_text,
    usage_of,
)
from tests.proxy.conftest import MODEL, Stack, StackFactory

NO_STORE = {"Cache-Control": "no-store"}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
async def cached(stack_factory: StackFactory) -> Stack:
    return await stack_factory(n=1, response_cache="memory")


async def computed(stack: Stack) -> int:
    """Generation requests the replica has answered."""
    return len(await stack.generations())


def _without_volatile(body: bytes) -> dict[str, Any]:
    doc = stable(orjson.loads(body))
    doc["usage"] = {k: v for k, v in doc["usage"].items() if k != "prompt_tokens_details"}
    return dict(doc)


async def test_a_hit_answers_the_original_without_the_replica(cached: Stack) -> None:
    body = chat("what is the capital of france")
    s1, miss, h1 = await ask(cached.url, CHAT_PATH, body)
    s2, hit, h2 = await ask(cached.url, CHAT_PATH, body)
    assert (s1, h1["x-kvroute-cache"], s2, h2["x-kvroute-cache"]) == (200, "miss", 200, "hit")
    assert await computed(cached) == 1
    assert _without_volatile(hit) == _without_volatile(miss)
    first, again = orjson.loads(miss), orjson.loads(hit)
    assert again["id"] != first["id"] and "x-kvroute-replica" not in h2
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": first["usage"]["prompt_tokens"]}
    assert (
        'result="hit"' in cached.metrics() and "kvroute_response_cache_stores_total 1.0" in cached.metrics()
    )


@pytest.mark.parametrize(("path", "make"), [(CHAT_PATH, chat), (TEXT_PATH, completion)])
async def test_a_streamed_hit_replays_the_stream_chunk_for_chunk(cached: Stack, path: str, make: Any) -> None:
    body = make("tell me about rivers", **USAGE)
    _, direct, _ = await ask(cached.url, path, body)
    _, replay, headers = await ask(cached.url, path, body)
    assert headers["x-kvroute-cache"] == "hit" and headers["content-type"].startswith("text/event-stream")
    assert await computed(cached) == 1
    first, again = events(direct), events(replay)
    assert [stable(e) for e in again[:-2]] == [stable(e) for e in first[:-2]]  # all but usage and DONE
    assert kinds(again)[-2:] == kinds(first)[-2:] == ["usage", "DONE"]
    assert counts(usage_of(again)) == counts(usage_of(first))


@pytest.mark.parametrize(("path", "make"), [(CHAT_PATH, chat), (TEXT_PATH, completion)])
@pytest.mark.parametrize("logprobs", [False, True])
async def test_a_stored_body_replays_as_the_stream_the_replica_sends(
    cached: Stack, path: str, make: Any, logprobs: bool
) -> None:
    lp = ({"logprobs": True, "top_logprobs": 2} if path == CHAT_PATH else {"logprobs": 2}) if logprobs else {}
    await ask(cached.url, path, make("name three birds", **lp))  # a non-streamed miss is stored
    _, replay, headers = await ask(cached.url, path, make("name three birds", **lp, **USAGE))
    _, direct, _ = await ask(cached.url, path, make("name three birds", **lp, **USAGE), NO_STORE)
    assert headers["x-kvroute-cache"] == "hit" and await computed(cached) == 2
    again, first = events(replay), events(direct)
    assert streamed_text(again) == streamed_text(first) and streamed_text(first)
    assert kinds(again) == kinds(first)
    assert counts(usage_of(again)) == counts(usage_of(first))
    if logprobs:
        assert _logprobs(again) == _logprobs(first)


def _logprobs(evs: list[Any]) -> list[Any]:
    """Per-token logprobs of a stream (chat ``content`` entries, completions' token_logprobs)."""
    out: list[Any] = []
    for e in evs:
        for c in e["choices"] if isinstance(e, dict) else ():
            lp = c.get("logprobs") or {}
            out += lp.get("content") or lp.get("token_logprobs") or []
    return out


@pytest.mark.parametrize(("path", "make"), [(CHAT_PATH, chat), (TEXT_PATH, completion)])
async def test_a_stored_stream_answers_as_the_body_the_replica_sends(
    cached: Stack, path: str, make: Any
) -> None:
    await ask(cached.url, path, make("count to five", **USAGE))
    _, hit, headers = await ask(cached.url, path, make("count to five"))
    _, direct, _ = await ask(cached.url, path, make("count to five"), NO_STORE)
    assert headers["x-kvroute-cache"] == "hit" and await computed(cached) == 2
    got, want = orjson.loads(hit), orjson.loads(direct)
    assert got["choices"] == want["choices"] and got["object"] == want["object"]
    assert counts(got["usage"]) == counts(want["usage"])


async def test_a_stream_without_usage_serves_streams_but_not_a_body(cached: Stack) -> None:
    stream = chat("a stream without usage", stream=True)
    await ask(cached.url, CHAT_PATH, stream)
    assert (await ask(cached.url, CHAT_PATH, stream))[2]["x-kvroute-cache"] == "hit"
    no_usage = events((await ask(cached.url, CHAT_PATH, stream))[1])
    assert usage_of(no_usage) is None and kinds(no_usage)[-1] == "DONE"
    plain = chat("a stream without usage")
    assert (await ask(cached.url, CHAT_PATH, plain))[2]["x-kvroute-cache"] == "miss"  # needs usage
    assert (await ask(cached.url, CHAT_PATH, plain))[2]["x-kvroute-cache"] == "hit"
    assert await computed(cached) == 2


async def test_the_sdk_streams_a_stored_tool_call(cached: Stack) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": _CITY}}
    kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "weather in oslo?"}]}
    kw |= {"tools": [tool], "tool_choice": "required", "temperature": 0}
    async with openai.AsyncOpenAI(base_url=cached.url + "/v1", api_key="k", max_retries=0) as client:
        first = await client.chat.completions.create(**kw)
        stream = await client.chat.completions.create(**kw, stream=True)
        chunks = [c async for c in stream]
    call = first.choices[0].message.tool_calls
    assert call is not None and await computed(cached) == 1
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(d.id, d.function.name, d.function.arguments) for d in deltas if d.function] == [
        (call[0].id, call[0].function.name, call[0].function.arguments)
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


_CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def test_a_streamed_tool_call_answers_as_the_body(cached: Stack) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": _CITY}}
    body = chat("weather in bergen?", tools=[tool], tool_choice="required")
    _, streamed, _ = await ask(cached.url, CHAT_PATH, body | USAGE)
    assert "tool" in kinds(events(streamed))
    _, hit, headers = await ask(cached.url, CHAT_PATH, body)
    _, direct, _ = await ask(cached.url, CHAT_PATH, body, NO_STORE)
    assert headers["x-kvroute-cache"] == "hit" and await computed(cached) == 2
    assert orjson.loads(hit)["choices"] == orjson.loads(direct)["choices"]


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": None},  # absent: the engine's default samples
        {"temperature": 0.7},
        {"temperature": 0, "n": 2},
        {"temperature": 0, "return_cached_tokens_details": True},
    ],
)
async def test_requests_that_may_differ_are_never_cached(cached: Stack, fields: dict[str, Any]) -> None:
    body = {k: v for k, v in chat("sample me", **fields).items() if v is not None}
    for _ in range(2):
        status, _, headers = await ask(cached.url, CHAT_PATH, body)
        assert (status, headers["x-kvroute-cache"]) == (200, "bypass")
    assert await computed(cached) == 2


async def test_a_seed_makes_any_temperature_cacheable(cached: Stack) -> None:
    body = chat("seeded", temperature=0.9, seed=7)
    assert [(await ask(cached.url, CHAT_PATH, body))[2]["x-kvroute-cache"] for _ in range(2)] == [
        "miss",
        "hit",
    ]
    other = chat("seeded", temperature=0.9, seed=8)
    assert (await ask(cached.url, CHAT_PATH, other))[2]["x-kvroute-cache"] == "miss"


async def test_fields_that_change_the_output_change_the_key(cached: Stack) -> None:
    base = chat("keyed")
    await ask(cached.url, CHAT_PATH, base)
    same = {"stream_options": {"include_usage": True}, "user": "u2", "rid": "r-77", "metadata": {"a": 1}}
    assert (await ask(cached.url, CHAT_PATH, dict(reversed(list((base | same).items())))))[2][
        "x-kvroute-cache"
    ] == "hit"
    for changed in (
        {"max_tokens": 13},
        {"stop": ["x"]},
        {"top_p": 0.5},
        {"messages": [{"role": "system", "content": "keyed"}]},
    ):
        assert (await ask(cached.url, CHAT_PATH, base | changed))[2]["x-kvroute-cache"] == "miss", changed


async def test_cache_control_no_store_and_no_cache(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, response_cache="memory", response_cache_ttl=1.5)
    body = chat("cache control")
    assert (await ask(stack.url, CHAT_PATH, body, {"Cache-Control": "no-store"}))[2][
        "x-kvroute-cache"
    ] == "bypass"
    assert (await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"] == "miss"  # no-store stored nothing
    await asyncio.sleep(1.0)
    refresh = await ask(stack.url, CHAT_PATH, body, {"Cache-Control": "max-age=0, No-Cache"})
    assert refresh[2]["x-kvroute-cache"] == "bypass" and await computed(stack) == 3  # not read
    await asyncio.sleep(1.0)  # 2 s after the first write, 1 s after the refresh
    assert (await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"] == "hit"


async def test_entries_expire_after_the_ttl(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, response_cache="memory", response_cache_ttl=0.4)
    body = chat("short lived")
    got = [(await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"] for _ in range(2)]
    await asyncio.sleep(0.5)
    got.append((await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"])
    assert got == ["miss", "hit", "miss"]


async def test_the_least_recently_used_answer_is_evicted(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, response_cache="memory", response_cache_max_entries=2)
    a, b, c = chat("first"), chat("second"), chat("third")
    for body in (a, b, a, c):  # a is used again after b: b is the least recently used when c arrives
        await ask(stack.url, CHAT_PATH, body)
    got = [(await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"] for body in (a, c, b)]
    assert got == ["hit", "hit", "miss"]


async def test_tenants_never_share_an_answer(cached: Stack) -> None:
    body = chat("tenant question")
    salted = [body | {"cache_salt": "tenant-a"}, body | {"cache_salt": "tenant-b"}, body]
    assert [(await ask(cached.url, CHAT_PATH, b))[2]["x-kvroute-cache"] for b in salted] == ["miss"] * 3
    keys = [{"Authorization": "Bearer key-1"}, {"Authorization": "Bearer key-2"}]
    assert [(await ask(cached.url, CHAT_PATH, body, k))[2]["x-kvroute-cache"] for k in keys] == ["miss"] * 2
    assert (await ask(cached.url, CHAT_PATH, body | {"cache_salt": "tenant-a"}))[2][
        "x-kvroute-cache"
    ] == "hit"
    assert (await ask(cached.url, CHAT_PATH, body, keys[1]))[2]["x-kvroute-cache"] == "hit"


async def test_failed_and_cut_answers_are_not_stored(cached: Stack) -> None:
    replica = cached.replicas[0]
    await replica.fault(action="fail", status=500, count=3)  # the first attempt and both retries
    assert (await ask(cached.url, CHAT_PATH, chat("fails once")))[0] == 500
    assert (await ask(cached.url, CHAT_PATH, chat("fails once")))[2]["x-kvroute-cache"] == "miss"
    await replica.fault(action="cut_stream", after_chunks=2, count=1)
    await ask(cached.url, CHAT_PATH, chat("cut once", **USAGE))
    assert (await ask(cached.url, CHAT_PATH, chat("cut once", **USAGE)))[2]["x-kvroute-cache"] == "miss"


async def test_the_access_log_names_a_hit(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await stack_factory(n=1, response_cache="memory", access_log=True)
    caplog.set_level(logging.INFO, logger="kvroute.access")
    body = chat("logged twice")
    usage = [orjson.loads((await ask(stack.url, CHAT_PATH, body))[1])["usage"] for _ in range(2)]
    miss, hit = [r.getMessage() for r in caplog.records if r.name == "kvroute.access"]
    assert f"replica={stack.urls[0]}" in miss and "attempts=1" in miss
    prompt = usage[1]["prompt_tokens"]
    assert f"replica=- reason=response_cache ttft_ms=- prompt={prompt} cached={prompt}" in hit
    assert "attempts=0" in hit


async def test_off_by_default(stack: Stack) -> None:
    for _ in range(2):
        _, _, headers = await ask(stack.url, CHAT_PATH, chat("no cache here"))
        assert "x-kvroute-cache" not in headers
    assert await computed(stack) == 2 and "kvroute_response_cache" not in stack.metrics()
