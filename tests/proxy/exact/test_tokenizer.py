"""proxy/exact/tokenizer.py against the real BPE tokenizer of emulator/model_bpe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from proxy.exact import tokenizer as tokenizer_module
from proxy.exact.prefix_cache import PrefixCache
from proxy.exact.tokenizer import PromptTokenizer
from proxy.front.openai import parse_request
from proxy.types import Route
from routing.prompt import TokenPrompt
from tests.proxy.conftest import spy_threads

DIR = Path(__file__).resolve().parents[3] / "emulator" / "model_bpe"
RAW = Tokenizer.from_file(str(DIR / "tokenizer.json"))
TEMPLATE = json.loads((DIR / "tokenizer_config.json").read_text())["chat_template"]
WORDS = st.sampled_from(["the", "cache", "route", " ", "\n", "é", "日本", "<|im_end|>", "fox", "42", "  x"])
TEXT = st.lists(WORDS, max_size=30).map("".join)
BASE = PromptTokenizer.load(str(DIR))
ROLE = st.sampled_from(["user", "assistant", "system", "tool"])


def _direct(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> list[int]:
    """The reference: HF transformers' jinja setup rendered by hand, then one plain encode."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    text = env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=True)
    ids: list[int] = RAW.encode(text, add_special_tokens=False).ids
    return ids


def _chat(body: dict[str, Any]) -> list[int]:
    tok = PromptTokenizer.load(str(DIR))
    return list(tok.chat_ids(tok.chat_text(body)))


def test_render_and_encode_equal_a_direct_encode_of_the_rendered_template() -> None:
    messages = [
        {"role": "system", "content": "You route KV caches."},
        {"role": "user", "content": "Which replica holds 日本 text? <|im_end|> no"},
    ]
    ids = _chat({"messages": messages})
    assert ids == _direct(messages) and RAW.decode(ids[:3], skip_special_tokens=False).startswith(
        "<|im_start|>"
    )


def test_text_parts_are_joined_and_a_final_assistant_turn_is_continued_or_made_a_user_turn() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert _chat({"messages": [{"role": "user", "content": parts}]}) == _direct(
        [{"role": "user", "content": "a b"}]
    )
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, the"}]
    continued = _chat({"messages": turns, "continue_final_message": True})
    assert continued == _direct(turns[:1]) + RAW.encode("Sure, the").ids
    assert _chat({"messages": turns}) == _direct([turns[0], {"role": "user", "content": "Sure, the"}])


def test_tools_render_as_sglang_passes_them_with_hf_tojson_unless_tool_choice_is_none() -> None:
    tools = [{"type": "function", "function": {"name": "météo", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    functions = [{"description": None, "name": "météo", "parameters": {"type": "object"}, "strict": False}]
    assert _chat({"messages": messages, "tools": tools}) == _direct(messages, functions)  # as SGLang's
    assert _chat({"messages": messages, "tools": tools, "tool_choice": "none"}) == _direct(messages)
    assert _direct(messages, tools) != _direct(messages)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(ROLE, TEXT), min_size=1, max_size=8), st.integers(1, 8))
def test_the_prefix_cache_gives_exactly_the_cold_ids_of_a_growing_conversation(
    turns: list[tuple[str, str]], entries: int
) -> None:
    warm = BASE.with_cache(PrefixCache(max_entries=entries))
    messages: list[dict[str, Any]] = []
    for role, text in turns:
        messages.append({"role": role, "content": text})
        body = {"messages": list(messages)}
        rendered = warm.chat_text(body)
        assert list(warm.chat_ids(rendered)) == RAW.encode(rendered, add_special_tokens=False).ids
    assert len(warm.cache) <= entries


def test_a_cached_prefix_is_used_only_when_the_text_starts_with_it() -> None:
    tok = PromptTokenizer.load(str(DIR))
    a = tok.chat_text({"messages": [{"role": "user", "content": "first " * 50}]})
    tok.chat_ids(a)
    b = tok.chat_text({"messages": [{"role": "user", "content": "other " * 50}]})
    assert list(tok.chat_ids(b)) == RAW.encode(b, add_special_tokens=False).ids
    assert tok.cache.stats.hits == 0  # b shares "<|im_start|>" with a, never a cached cut of a


def test_the_cache_bounds_entries_and_ids() -> None:
    cache = PrefixCache(max_entries=3, max_ids=400)
    tok = PromptTokenizer.load(str(DIR), cache)
    for i in range(10):
        tok.chat_ids(tok.chat_text({"messages": [{"role": "user", "content": f"{i} words " * 20}]}))
        assert len(cache) <= 3 and cache.total_ids <= 400
    big = tok.chat_text({"messages": [{"role": "user", "content": "x y " * 500}]})
    tok.chat_ids(big)  # more than max_ids // 4: not stored
    assert cache.total_ids <= 400 and cache.stats.evicted > 0


def _parsed(route: Route, body: dict[str, Any]) -> Any:
    return parse_request(route, orjson.dumps(body))


async def test_requests_become_token_prompts_and_unrenderable_ones_fall_back_counted() -> None:
    tok = PromptTokenizer.load(str(DIR))
    seen: list[tuple[str, float]] = []
    tok.observe = lambda mode, s: seen.append((mode, s))
    chat = _parsed(
        Route.CHAT, {"model": "m", "messages": [{"role": "user", "content": "hello"}], "cache_salt": "s"}
    )
    out = await tok.tokenized(chat)
    assert out.routing.prompt == TokenPrompt(tuple(_direct([{"role": "user", "content": "hello"}])))
    assert out.routing.namespace == chat.routing.namespace and out.routing.max_new_tokens is None
    text = await tok.tokenized(_parsed(Route.COMPLETIONS, {"model": "m", "prompt": "plain text"}))
    assert text.routing.prompt == TokenPrompt(tuple(RAW.encode("plain text").ids))
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    mm = _parsed(Route.CHAT, {"model": "m", "messages": [{"role": "user", "content": [image]}]})
    assert (await tok.tokenized(mm)) is mm
    bad = _parsed(
        Route.CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"function": {"name": "f"}}],
        },
    )
    tok.template = type(tok.template)("{{ raise_exception('no tools') if tools }}", {})  # type: ignore[misc]
    assert (await tok.tokenized(bad)) is bad
    ids = _parsed(Route.GENERATE, {"input_ids": [1, 2, 3]})
    assert (await tok.tokenized(ids)) is ids
    assert dict(tok.counts) == {"tokenized": 2, "fallback_multimodal": 1, "fallback_template": 1, "ids": 1}
    assert [m for m, _ in seen] == ["inline", "inline"]


async def test_long_new_text_is_encoded_in_a_thread_with_the_same_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tok = PromptTokenizer.load(str(DIR))
    threads = spy_threads(monkeypatch, tokenizer_module)
    long = "route the cache " * 1000
    body = {"model": "m", "messages": [{"role": "user", "content": long}]}
    out = await tok.tokenized(_parsed(Route.CHAT, body))
    assert len(threads) == 1 and out.routing.prompt == TokenPrompt(tuple(_direct(body["messages"])))
    grown = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "?"},
        ],
    }
    rendered = tok.chat_text(grown)
    out = await tok.tokenized(_parsed(Route.CHAT, grown))  # the long turn is cached: inline
    assert len(threads) == 1 and out.routing.prompt == TokenPrompt(tuple(RAW.encode(rendered).ids))
    assert tok.cache.stats.hits == 1


BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "In 日本?"}]},
    {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"type": "function", "function": {"name": "w", "description": "d", "parameters": {}}}],
    },
    {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [{"type": "function", "function": {"name": n}} for n in ("w", "v")],
        "tool_choice": {"type": "function", "function": {"name": "v"}},
    },
    {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
        "tools": [{"type": "function", "function": {"name": "w"}}],
        "tool_choice": "none",
    },
    {"messages": [{"role": "user", "content": [{"type": "text", "text": t} for t in ("a", "b")]}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
     "continue_final_message": True},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]},
]  # fmt: skip


@pytest.mark.parametrize("body", BODIES)
def test_the_gateway_tokenizes_a_chat_as_the_emulated_replica_does(body: dict[str, Any]) -> None:
    from emulator.hf_tokenizer import HfTokenizer

    replica = HfTokenizer(str(DIR)).chat_ids(body["messages"], body.get("tools"), body)
    assert _chat(body) == replica
