"""The response cache's parts on their own: the eligibility rule, the key, the capture's refusals, the
stored answer's two faces on shapes the emulator does not produce (reasoning, tool-call deltas), the
memory store's bounds on a fake clock, and the settings."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.answers.answer import Answer, hit_stream
from proxy.answers.cache import bypass_reason, request_key, tenant_of
from proxy.answers.capture import StreamAnswer, from_body
from proxy.answers.store import MemoryStore
from proxy.config.settings import SettingsError, load_settings
from proxy.config.urls import redacted_url
from proxy.front.openai import parse_request
from proxy.types import Route
from routing.canonical import render
from routing.prompt import ChatPrompt, Message, TextPrompt, TokenPrompt

MSG = [{"role": "user", "content": "hi"}]


def _key(body: dict[str, Any], route: Route = Route.CHAT, auth: str | None = None) -> str:
    parsed = parse_request(route, orjson.dumps(body))
    return request_key(parsed, tenant_of(parsed, auth or ""))


@pytest.mark.parametrize(
    ("route", "fields", "reason"),
    [
        (Route.CHAT, {"temperature": 0}, None),
        (Route.CHAT, {"temperature": 0.0, "n": 1, "logprobs": True}, None),
        (Route.CHAT, {"temperature": 1.3, "seed": 0}, None),
        (Route.CHAT, {}, "sampling"),
        (Route.CHAT, {"temperature": 0.2}, "sampling"),
        (Route.CHAT, {"temperature": False}, "sampling"),
        (Route.CHAT, {"temperature": 0.5, "seed": True}, "sampling"),
        (Route.CHAT, {"temperature": 0, "n": 3}, "choices"),
        (Route.COMPLETIONS, {"temperature": 0, "prompt": ["a", "b"]}, "choices"),
        (Route.COMPLETIONS, {"temperature": 0, "prompt": [1, 2, 3]}, None),
        (Route.CHAT, {"temperature": 0, "return_cached_tokens_details": True}, "usage_details"),
        (Route.COMPLETIONS, {"temperature": 0, "echo": True}, "echo"),
        (Route.CHAT, {"temperature": 0, "echo": True}, "echo"),
        (Route.GENERATE, {"temperature": 0}, "route"),
    ],
)
def test_the_eligibility_rule(route: Route, fields: dict[str, Any], reason: str | None) -> None:
    assert bypass_reason(route, fields, stream=False) == reason


def test_continuous_usage_is_only_a_bypass_for_streams() -> None:
    body = {"temperature": 0, "stream_options": {"continuous_usage_stats": True}}
    assert bypass_reason(Route.CHAT, body, stream=True) == "usage_details"
    assert bypass_reason(Route.CHAT, body, stream=False) is None


def test_the_key_ignores_order_and_transport_fields_but_not_output_fields() -> None:
    base: dict[str, Any] = {"model": "m", "messages": MSG, "temperature": 0, "max_tokens": 5}
    same: dict[str, Any] = {
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u",
        "rid": "r",
        "priority": 3,
    }
    assert _key(base) == _key(dict(reversed(list((base | same).items()))))
    changed: list[dict[str, Any]] = [
        {"max_tokens": 6},
        {"seed": 1},
        {"tools": []},
        {"response_format": {"type": "json_object"}},
    ]
    changed += [{"model": "other"}, {"cache_salt": "t"}, {"lora_path": "a"}, {"logprobs": True}]
    keys = {_key(base | c) for c in changed}
    assert len(keys) == len(changed) and _key(base) not in keys
    assert _key(base, auth="Bearer a") != _key(base, auth="Bearer b") != _key(base)


def test_the_key_tells_apart_prompts_the_routing_rendering_merges() -> None:
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    as_parts = ChatPrompt((Message("user", parts),))
    assert render(as_parts) == render(
        ChatPrompt((Message("user", "hi"),))
    )  # one KV prefix, maybe two answers
    assert render(TextPrompt("<ids>1,2,")) == render(TokenPrompt((1, 2)))
    assert _key({"model": "m", "messages": MSG, "temperature": 0}) != _key(
        {"model": "m", "messages": [{"role": "user", "content": parts}], "temperature": 0}
    )
    text = {"model": "m", "prompt": "<ids>1,2,", "temperature": 0}
    assert _key(text, Route.COMPLETIONS) != _key(text | {"prompt": [1, 2]}, Route.COMPLETIONS)


def _sse(*docs: Any) -> bytes:
    return b"".join(b"data: " + (d if isinstance(d, bytes) else orjson.dumps(d)) + b"\n\n" for d in docs)


def _choice(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "logprobs": None, "finish_reason": None} | fields], "usage": None}


CHUNKS = [
    _choice(delta={"role": "assistant", "content": ""}),
    _choice(delta={"reasoning_content": "think "}),
    _choice(delta={"reasoning_content": "hard"}),
    _choice(delta={"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}]}),
    _choice(delta={"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
    _choice(delta={"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
    _choice(delta={}, finish_reason="tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
]


def _stream(data: bytes, chat: bool = True) -> Answer | None:
    reader = StreamAnswer(chat, limit=1 << 20)
    for i in range(0, len(data), 7):  # events split across chunks
        reader.feed(data[i : i + 7])
    return reader.answer()


def test_streamed_deltas_merge_into_one_message() -> None:
    answer = _stream(_sse(*CHUNKS, b"[DONE]").replace(b"\n\n", b"\r\n\r\n"))
    assert answer is not None and answer.usage == CHUNKS[-1]["usage"]
    message = answer.body_choice()["message"]
    assert message["reasoning_content"] == "think hard" and message["content"] is None
    assert message["tool_calls"] == [
        {"id": "c1", "index": 0, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    replay = [orjson.loads(e[6:]) for e in hit_stream(answer, "x", 1, "m", True).split(b"\n\n")[:-2]]
    assert [c["choices"][0] for c in replay[:-1]] == [c["choices"][0] for c in CHUNKS[:-1]]


def test_a_body_replays_reasoning_before_content() -> None:
    message = {
        "role": "assistant",
        "content": "two words",
        "reasoning_content": "so then",
        "tool_calls": None,
    }
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {}}
    answer = from_body(True, orjson.dumps(body))
    assert answer is not None
    deltas = [c["delta"] for c in answer.stream_choices()]
    said = [(k, d[k]) for d in deltas for k in ("reasoning_content", "content") if d[k]]
    assert said == [
        ("reasoning_content", "so"),
        ("reasoning_content", " then"),
        ("content", "two"),
        ("content", " words"),
    ]
    assert answer.stream_choices()[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "data",
    [
        _sse(*CHUNKS),  # no [DONE]
        _sse(*CHUNKS[:3], {"error": {"message": "boom"}}, b"[DONE]"),
        _sse(*CHUNKS[:6], _choice(delta={}, finish_reason="abort"), b"[DONE]"),
        _sse({"choices": [{"index": 0}, {"index": 1}]}, *CHUNKS, b"[DONE]"),
        _sse(*CHUNKS[:1], _choice(index=1, delta={"content": "x"}), *CHUNKS[1:], b"[DONE]"),
        _sse(b"not json", *CHUNKS, b"[DONE]"),
    ],
)
def test_incomplete_or_failed_streams_are_not_captured(data: bytes) -> None:
    assert _stream(data) is None


def test_a_stream_beyond_the_limit_is_not_captured() -> None:
    data = _sse(*CHUNKS, b"[DONE]")
    reader = StreamAnswer(True, limit=len(data) - 1)
    reader.feed(data)
    assert reader.answer() is None and _stream(data) is not None


@pytest.mark.parametrize(
    "body",
    [
        {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}] * 2},
        {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "abort"}]},
        {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]},  # a completions choice in chat
        {"object": "error", "message": "bad"},
    ],
)
def test_bodies_that_are_not_one_complete_choice_are_refused(body: dict[str, Any]) -> None:
    assert from_body(True, orjson.dumps(body)) is None


def test_the_stored_form_round_trips_and_refuses_foreign_bytes() -> None:
    answer = _stream(_sse(*CHUNKS, b"[DONE]"))
    assert answer is not None and Answer.from_json(answer.to_json()) == answer
    for foreign in (b"", b"[]", b'{"v": 99, "chat": true}', b'{"v": 1, "chat": true, "chunks": []}'):
        assert Answer.from_json(foreign) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_bounds_bytes_entries_and_age() -> None:
    clock = Clock()
    store = MemoryStore(ttl_s=10.0, max_bytes=30, max_entries=3, clock=clock)
    for key in ("a", "b", "c"):
        await store.put(key, b"123456789")  # 10 bytes each with the key
    assert len(store) == 3 and store.bytes == 30
    await store.get("a")
    await store.put("d", b"123456789")  # over 30 bytes: b, the least recently used, goes
    assert [await store.get(k) is not None for k in "abcd"] == [True, False, True, True]
    assert not await store.put("e", b"x" * 30)  # larger than all of max_bytes: never stored
    assert await store.get("e") is None and store.bytes == 30
    await store.put("f", b"x" * 19)  # 20 bytes: two old entries leave
    assert len(store) == 2 and store.bytes == 30
    clock.now = 10.0
    assert await store.get("f") is None and store.bytes == 10


def test_settings_take_off_memory_or_a_redis_url() -> None:
    assert load_settings([], {}).response_cache == "off"
    flags = ["--response-cache", "redis://u:pw@127.0.0.1:6380/2", "--response-cache-ttl", "30"]
    st = load_settings(flags, {})
    assert (st.response_cache, st.response_cache_ttl) == ("redis://u:pw@127.0.0.1:6380/2", 30.0)
    assert st.redacted()["response_cache"] == "redis://u:***@127.0.0.1:6380/2"
    assert load_settings([], {"KVROUTE_RESPONSE_CACHE": "memory"}).response_cache == "memory"
    for bad in ("on", "http://x", "redis://", "redis://h:99999"):
        with pytest.raises(SettingsError, match="response_cache"):
            load_settings(["--response-cache", bad], {})
    with pytest.raises(SettingsError, match="response_cache_max_bytes"):
        load_settings(["--response-cache-max-bytes", "0"], {})
    assert redacted_url("redis://127.0.0.1:1/0") == "redis://127.0.0.1:1/0"
