"""The Responses wing's parts alone: the chat view routing hashes (a chain's turns hash like the equivalent
chat conversation, each turn's rendering starting with the one before), the echo patch of bodies and of
stream events split anywhere, list pages, the body a replica gets, and the stores' deletes, reads of
several keys and renewals (in memory and in a real Redis, strict)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.answers.store import MemoryStore, RedisStore, StoreUnavailable
from proxy.config.settings import load_settings
from proxy.errors import InvalidRequest, NotFound
from proxy.front.openai import parse_request
from proxy.responses.chat_view import chat_prompt
from proxy.responses.echo import Echo, EchoTap, split_events
from proxy.responses.items import listed, page
from proxy.responses.request import parse_create, parsed_request, upstream_body
from proxy.types import Route
from routing.canonical import render
from tests.redis_server import RedisServer

ANSWER = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "phase": "final_answer",
    "content": [{"type": "output_text", "text": "a tree", "annotations": [], "logprobs": None}],
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": '{"w": 1}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "found"}
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "strict": True}


def test_a_chain_renders_like_the_equivalent_chat() -> None:
    body: dict[str, Any] = {"instructions": "Be brief.", "tools": [TOOL]}
    turn1 = render(chat_prompt([{"role": "user", "content": "what is kept?"}], body))
    items = [
        {"role": "user", "content": "what is kept?"},
        ANSWER,
        CALL,
        OUTPUT,
        {"role": "user", "content": "ok"},
    ]
    turn2 = render(chat_prompt(items, body))
    assert turn2.startswith(turn1)
    chat = {
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "what is kept?"},
            {"role": "assistant", "content": "a tree"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"w": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
            {"role": "user", "content": "ok"},
        ],
    }
    assert turn2 == render(parse_request(Route.CHAT, orjson.dumps(chat)).routing.prompt)


def test_developer_messages_reasoning_and_unknown_items() -> None:
    items: list[Any] = [
        {"role": "developer", "content": "use tools"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {**ANSWER, "phase": None},
        {"type": "item_reference", "id": "x"},  # SGLang refuses it: the replica answers that
    ]
    prompt = chat_prompt(items, {"reasoning": {"effort": "low"}})
    roles = [(m.role, m.content) for m in prompt.messages]
    assert roles == [
        ("system", "Developer instructions:\nuse tools"),
        ("assistant", [{"type": "text", "text": "a tree"}]),
    ]
    assert prompt.options == (("reasoning_effort", "low"),)


def _echo() -> Echo:
    return Echo("resp_mine", "gpt-4o", "resp_prev", True, False, "conv_1")


def test_echo_patches_a_body_keeping_its_keys_in_place() -> None:
    upstream = {
        "id": "resp_mine",
        "object": "response",
        "model": "served",
        "previous_response_id": None,
        "store": False,
    }
    doc = _echo().body(orjson.dumps(upstream))
    assert doc is not None and list(doc)[:5] == list(upstream)
    assert (doc["model"], doc["previous_response_id"], doc["store"], doc["conversation"]) == (
        "gpt-4o",
        "resp_prev",
        True,
        {"id": "conv_1"},
    )
    assert _echo().body(b'{"error": {"message": "x"}}') is None and _echo().body(b"not json") is None


def _frame(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **payload}) + b"\n\n"


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
async def test_echo_tap_rewrites_lifecycle_events_split_anywhere(size: int) -> None:
    response = {
        "id": "resp_mine",
        "object": "response",
        "model": "served",
        "store": False,
        "status": "in_progress",
    }
    delta = _frame("response.output_text.delta", {"delta": "h\u00e9", "sequence_number": 2})
    stream = (
        _frame("response.created", {"response": response, "sequence_number": 0})
        + delta
        + _frame(
            "response.completed", {"response": {**response, "status": "completed"}, "sequence_number": 3}
        )
    )
    finals: list[dict[str, Any]] = []

    async def on_final(doc: dict[str, Any]) -> None:
        finals.append(doc)

    tap = EchoTap(_echo(), on_final)
    out = b"".join([c async for c in tap.stream(200, _chunks(stream, size))])
    events, rest = split_events(out)
    assert rest == b"" and len(events) == 3 and events[1][0] + events[1][1] == delta  # byte for byte
    created = orjson.loads(events[0][0].split(b"\ndata: ")[1])
    assert created["response"]["model"] == "gpt-4o" and created["response"]["store"] is True
    assert [f["status"] for f in finals] == ["completed"] and tap.final == finals[0]
    assert events[2][0].startswith(b"event: response.completed\ndata: {")


def test_pages_of_items() -> None:
    items = [listed({"role": "user", "content": f"n{i}"}, "resp_x", i) for i in range(5)]
    assert items[0]["content"] == [{"type": "input_text", "text": "n0"}] and items[0]["id"].startswith("msg_")
    first = page(items, {"limit": "2"})
    assert [i["content"][0]["text"] for i in first["data"]] == ["n4", "n3"] and first["has_more"]
    rest = page(items, {"limit": "2", "order": "asc", "after": items[2]["id"]})
    assert [i["id"] for i in rest["data"]] == [items[3]["id"], items[4]["id"]] and not rest["has_more"]
    assert rest["first_id"] == items[3]["id"] and rest["last_id"] == items[4]["id"]
    for bad in ({"limit": "0"}, {"limit": "x"}, {"order": "up"}):
        with pytest.raises(InvalidRequest):
            page(items, bad)
    with pytest.raises(NotFound):
        page(items, {"after": "msg_gone"})


def test_the_body_a_replica_gets() -> None:
    raw = orjson.dumps(
        {
            "model": "gpt-4o",
            "input": "hi",
            "previous_response_id": "resp_1",
            "background": False,
            "request_id": "x",
        }
    )
    req = parse_create(raw)
    body = upstream_body(req, [{"role": "user", "content": "before"}], "resp_new", "served")
    assert body == {
        "model": "served",
        "input": [{"role": "user", "content": "before"}, {"role": "user", "content": "hi"}],
        "store": False,
        "request_id": "resp_new",
    }
    parsed = parsed_request(body | {"max_output_tokens": 10}, len(raw), None, None)
    assert (
        parsed.routing.max_new_tokens == 8
        and parsed.rid == "resp_new"
        and parsed.upstream_path == "/v1/responses"
    )
    for bad in ({"input": "x"}, {"model": "m", "input": 3}, {"model": "m", "input": "x", "stream": "yes"}):
        with pytest.raises(InvalidRequest):
            parse_create(orjson.dumps(bad))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_deletes_reads_several_and_renews() -> None:
    clock = Clock()
    store = MemoryStore(ttl_s=10.0, max_bytes=1000, max_entries=10, clock=clock)
    for key in "abc":
        await store.put(key, key.encode())
    assert await store.get_many(["a", "x", "c"]) == [b"a", None, b"c"]
    assert await store.delete("b") and not await store.delete("b")
    clock.now = 8.0
    assert await store.get_many([], renew=["a", "x"]) == []
    clock.now = 12.0
    assert await store.get_many(["a", "c"]) == [b"a", None]  # a was renewed, c expired
    assert store.bytes == 2


async def test_a_strict_redis_store_raises_when_redis_is_gone() -> None:
    server = RedisServer()
    server.start()
    try:
        store = RedisStore(server.url, ttl_s=10.0, max_bytes=100, strict=True)
        await store.put(
            "a",
            b"1",
        )
        server.client().pexpire("a", 1000)
        assert await store.get_many(["a", "b"], renew=["a", "b"]) == [b"1", None]
        assert 9000 < server.client().pttl("a") <= 10_000  # renewed
        assert await store.get_many([], renew=["a"]) == []
        assert await store.delete("a") and not await store.delete("a")
        server.stop()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await store.get("a")
        with pytest.raises(StoreUnavailable):  # while down, skipped at once: still an error, never a miss
            await store.put("a", b"1")
        await store.close()
    finally:
        server.stop()


def test_settings_of_the_state() -> None:
    st = load_settings(["--responses-ttl", "60", "--responses-max-entries", "5"], {})
    assert (st.responses_ttl, st.responses_max_entries, st.responses_max_bytes) == (
        60.0,
        5,
        256 * 1024 * 1024,
    )
