"""Canonical prompt rendering: determinism, prefix growth, and what goes into the prefix.

Bodies go through the proxy's one parse (``proxy.front.openai.parse_request``) into typed prompts, which
``routing.canonical.render`` renders: together they are what decides a request's block hashes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.front.openai import parse_request
from proxy.types import Route
from routing.canonical import namespace_salt, render
from routing.prompt import ChatPrompt, Namespace, TextPrompt

CHAT = Route.CHAT


def canonical_prompt(route: Route, body: dict[str, Any]) -> str:
    """The rendering of a body as the gateway parses it (a chat without messages renders its header and
    tools only: the gateway rejects such a body, but it is the prefix of every conversation)."""
    if route is Route.CHAT and not body.get("messages"):
        one = parse_request(route, orjson.dumps({"model": "m", **body, "messages": [{"role": "user"}]}))
        assert isinstance(one.routing.prompt, ChatPrompt)
        return render(dataclasses.replace(one.routing.prompt, messages=()))
    return render(parse_request(route, orjson.dumps({"model": "m", **body})).routing.prompt)


text = st.text(min_size=0, max_size=40)
roles = st.sampled_from(["system", "user", "assistant", "tool"])
message = st.fixed_dictionaries(
    {
        "role": roles,
        "content": st.one_of(
            text, st.none(), st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), max_size=3)
        ),
    },
    optional={"name": st.text(min_size=1, max_size=8), "tool_call_id": st.text(min_size=1, max_size=8)},
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.dictionaries(st.text(max_size=6), json_value, max_size=3),
        }
    ),
    max_size=2,
)


def _shuffled(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _shuffled(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_shuffled(v) for v in value]
    return value


@settings(max_examples=60, deadline=None)
@given(st.lists(message, max_size=5), tools, st.integers(0, 4))
def test_key_order_and_whitespace_do_not_change_the_rendering(
    msgs: list[Any], tls: list[Any], indent: int
) -> None:
    body = {"model": "m", "messages": msgs, "tools": tls, "chat_template_kwargs": {"b": 1, "a": [2, 3]}}
    reparsed = json.loads(json.dumps(_shuffled(body), indent=indent or None))
    assert canonical_prompt(CHAT, reparsed) == canonical_prompt(CHAT, body)


@settings(max_examples=60, deadline=None)
@given(st.lists(message, min_size=1, max_size=6), tools)
def test_a_conversation_that_grows_keeps_its_previous_rendering_as_prefix(
    msgs: list[Any], tls: list[Any]
) -> None:
    for k in range(len(msgs)):
        shorter = canonical_prompt(CHAT, {"messages": msgs[:k], "tools": tls})
        longer = canonical_prompt(CHAT, {"messages": msgs[: k + 1], "tools": tls})
        assert longer.startswith(shorter)
        assert len(longer) > len(shorter)


def test_tools_come_before_messages_and_header_before_tools() -> None:
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    out = canonical_prompt(CHAT, body)
    assert out.index("enable_thinking") < out.index('"name":"f"') < out.index("hello")


def test_prefix_relevant_fields_change_the_rendering_and_others_do_not() -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]}
    plain = canonical_prompt(CHAT, base)
    assert canonical_prompt(CHAT, {**base, "chat_template_kwargs": {"enable_thinking": True}}) != plain
    assert canonical_prompt(CHAT, {**base, "continue_final_message": True}) != plain
    assert canonical_prompt(CHAT, {**base, "temperature": 0.1, "max_tokens": 9, "stream": True}) == plain


def test_roles_names_tool_calls_and_ids_are_rendered() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"x":1}'}}
    a = {"role": "assistant", "content": None, "tool_calls": [call]}
    t = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    out = canonical_prompt(CHAT, {"messages": [a, t]})
    assert '"name":"get"' in out and "c1" in out and "42" in out
    user_a = canonical_prompt(CHAT, {"messages": [{"role": "user", "content": "x", "name": "ann"}]})
    user_b = canonical_prompt(CHAT, {"messages": [{"role": "user", "content": "x", "name": "bob"}]})
    system = canonical_prompt(CHAT, {"messages": [{"role": "system", "content": "x"}]})
    assert len({user_a, user_b, system}) == 3


def test_content_parts_equal_the_plain_string_and_images_are_hashed() -> None:
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
    assert canonical_prompt(CHAT, {"messages": [{"role": "user", "content": parts}]}) == canonical_prompt(
        CHAT, {"messages": [{"role": "user", "content": "abcd"}]}
    )
    url = "data:image/png;base64," + "A" * 5000
    img = canonical_prompt(
        CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    )
    other = canonical_prompt(
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url + "B"}}]}]},
    )
    assert img != other and len(img) < 100  # the payload is hashed, not copied


def test_completions_and_generate_prompts() -> None:
    comp, gen = Route.COMPLETIONS, Route.GENERATE
    assert canonical_prompt(comp, {"prompt": "once upon"}) == "once upon"
    assert canonical_prompt(comp, {"prompt": ["first", "second"]}) == "first"
    ids = canonical_prompt(comp, {"prompt": [1, 2, 3]})
    assert ids.startswith(canonical_prompt(comp, {"prompt": [1, 2]}))
    assert canonical_prompt(comp, {"prompt": [[5, 6], [7]]}) == canonical_prompt(comp, {"prompt": [5, 6]})
    assert canonical_prompt(gen, {"text": "abc"}) == "abc"
    assert canonical_prompt(gen, {"input_ids": [9, 8]}) == canonical_prompt(comp, {"prompt": [9, 8]})
    assert canonical_prompt(Route.PASSTHROUGH, {"input": "x"}) == ""
    assert render(TextPrompt("")) == "" and render(None) == ""


def _salt(body: dict[str, Any]) -> str:
    return namespace_salt(
        parse_request(
            Route.CHAT, orjson.dumps({"model": "m", **body, "messages": [{"role": "user", "content": "x"}]})
        ).routing.namespace
    )


def test_namespace_salt_follows_sglang_extra_key_and_adds_tenant() -> None:
    assert _salt({}) == ""
    assert _salt({"cache_salt": "a", "extra_key": "b"}) == "ab"  # SGLang concatenates
    assert namespace_salt(Namespace("a", tenant="t1")) != namespace_salt(Namespace("a", tenant="t2"))
    assert _salt({"lora_path": "x"}) != _salt({})
    assert _salt({"cache_salt": 5}) == ""  # non-strings are the engine's 400, not a salt
