"""Properties of the pseudo-tokenizer and the ChatML template (emulator/tokenizer.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emulator.tokenizer import (
    IMAGE_PLACEHOLDER,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    PseudoTokenizer,
    apply_chat_template,
    unknown_word,
)

GEN_PROMPT = "<|im_start|>assistant\n"
ENGLISH = (
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
    "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors."
)


def _injective(tok: PseudoTokenizer, text: str) -> bool:
    pieces = set(tok.pieces(text))
    return len({tok.piece_id(p) for p in pieces}) == len(pieces)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_round_trip_is_exact(text: str) -> None:
    tok = PseudoTokenizer()
    assert "".join(tok.pieces(text)) == text  # every character lands in exactly one piece
    ids = tok.encode(text)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert tok.count(text) == len(ids)
    assume(_injective(tok, text))  # two pieces sharing an id cannot both decode (see module docstring)
    assert tok.decode(ids) == text


def test_english_round_trip_and_density() -> None:
    tok = PseudoTokenizer()
    ids = tok.encode(ENGLISH)
    assert tok.decode(ids) == ENGLISH
    assert 3.5 <= len(ENGLISH) / len(ids) <= 4.5


def test_deterministic_across_instances_and_unknown_ids() -> None:
    a, b = PseudoTokenizer(), PseudoTokenizer()
    assert a.encode(ENGLISH) == b.encode(ENGLISH)
    assert b.decode([12345]) == unknown_word(12345) == PseudoTokenizer().decode([12345])
    assert unknown_word(12345) != unknown_word(12346)


def test_lru_is_bounded() -> None:
    tok = PseudoTokenizer(cache_size=8)
    ids = tok.encode(ENGLISH)
    assert tok.decode(ids[-4:]) == "".join(tok.pieces(ENGLISH)[-4:])
    assert len(tok._pieces) <= 8


def test_special_tokens_are_single_tokens() -> None:
    tok = PseudoTokenizer()
    for name, tid in SPECIAL_TOKENS.items():
        assert tok.encode(name) == [tid]
        assert tok.decode([tid]) == name
    assert tok.encode("x<|im_end|>\n") == [*tok.encode("x"), SPECIAL_TOKENS["<|im_end|>"], *tok.encode("\n")]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80), st.sampled_from(["\n", "<|im_end|>", "<|im_start|>"]), st.text(max_size=80))
def test_prefix_is_kept_after_a_boundary(a: str, boundary: str, b: str) -> None:
    tok = PseudoTokenizer()
    head = a + boundary
    assert tok.encode(head + b)[: len(tok.encode(head))] == tok.encode(head)


def test_counterexample_without_a_boundary() -> None:
    tok = PseudoTokenizer()
    assert tok.encode("abc" + "de")[: len(tok.encode("abc"))] != tok.encode("abc")


_content = st.one_of(
    st.text(max_size=40),
    st.none(),
    st.lists(
        st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=20)),
            st.just({"type": "image_url", "image_url": {"url": "data:x"}}),
        ),
        max_size=3,
    ),
)
_tool_call = st.builds(
    lambda name, args: {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}},
    st.text(min_size=1, max_size=8),
    st.sampled_from(['{"b": 1, "a": [2]}', "{}", "not json"]),
)
_message = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, _content),
    st.builds(lambda c: {"role": "assistant", "content": c}, _content),
    st.builds(
        lambda c, t: {"role": "assistant", "content": c, "tool_calls": t}, _content, st.lists(_tool_call)
    ),
    st.builds(lambda c: {"role": "tool", "tool_call_id": "c1", "content": c}, _content),
)
_tools = st.one_of(
    st.none(),
    st.lists(
        st.builds(
            lambda n: {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}},
            st.text(max_size=8),
        ),
        min_size=1,
        max_size=2,
    ),
)


@settings(max_examples=120, deadline=None)
@given(
    st.one_of(st.none(), st.text(max_size=30)), st.lists(_message, min_size=1, max_size=5), _message, _tools
)
def test_growing_conversation_keeps_earlier_tokens(
    system: str | None, history: list[dict[str, Any]], new: dict[str, Any], tools: list[Any] | None
) -> None:
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + history
    before = apply_chat_template(msgs, tools=tools)
    after = apply_chat_template([*msgs, new], tools=tools)
    assert before.endswith(GEN_PROMPT)
    stem = before[: -len(GEN_PROMPT)]
    assert stem == apply_chat_template(msgs, tools=tools, add_generation_prompt=False)
    assert after.startswith(stem)
    tok = PseudoTokenizer()
    old, grown = tok.encode(before), tok.encode(after)
    shared = len(old) - len(tok.encode(GEN_PROMPT))
    assert grown[:shared] == old[:shared]


def test_template_shape_tools_and_parts() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}],
        },
        {"role": "assistant", "content": None, "tool_calls": [_call("f", '{"b": 1, "a": 2}')]},
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    text = apply_chat_template(msgs, tools=tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '{"function":{"name":"f","parameters":{"a":2,"z":1}},"type":"function"}' in text
    assert f"<|im_start|>user\nsee{IMAGE_PLACEHOLDER}<|im_end|>\n" in text
    assert '<tool_call>\n{"arguments":{"a":2,"b":1},"name":"f"}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_end|>\n" + GEN_PROMPT)
    assert apply_chat_template(msgs, tools=tools) == text  # deterministic


def test_continue_final_message_leaves_the_turn_open() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    text = apply_chat_template(msgs, continue_final_message=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHel"


def _call(name: str, args: str) -> dict[str, Any]:
    return {"id": "1", "type": "function", "function": {"name": name, "arguments": args}}
