"""bench/overhead/cases.py: the cases' bodies are deterministic, the long prompt is ~40K tokens of the
emulator's tokenizer, and the unique prompts differ from their first tokens on."""

from __future__ import annotations

import orjson

from bench.overhead.cases import LONG_TOKENS, SMALL_GOALS, Goal, cases, goals, long_text
from emulator.tokenizer import PseudoTokenizer, chat_text


def prompt_ids(body: bytes) -> list[int]:
    doc = orjson.loads(body)
    return PseudoTokenizer().encode(chat_text(doc["messages"], None, doc))


def test_the_long_prompt_is_40k_tokens_in_160_kb_and_always_the_same() -> None:
    text = long_text()
    assert len(text) == 4 * LONG_TOKENS and text == long_text()
    assert PseudoTokenizer().count(text) == LONG_TOKENS
    plan = {c.name: c for c in cases("m", 16, 128, 1.0)}
    repeated = plan["40K prompt repeated"].body()
    assert repeated == plan["40K prompt repeated"].body() == cases("m", 16, 128, 1.0)[4].body()
    assert LONG_TOKENS < len(prompt_ids(repeated)) < LONG_TOKENS + 20
    assert 160_000 < len(repeated) < 161_000


def test_unique_prompts_differ_within_their_first_page() -> None:
    case = cases("m", 16, 128, 1.0)[5]
    first, second = prompt_ids(case.body()), prompt_ids(case.body())
    assert len(first) == len(second) > LONG_TOKENS
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert shared < 16  # the replica's page; kvroute's first 256-character block differs too


def test_counts_scale_and_the_levels_follow_the_flags() -> None:
    plan = cases("m", 8, 32, 0.5)
    assert [(c.name, c.concurrency, c.count) for c in plan] == [
        ("small chat", 1, 300),
        ("small chat", 8, 1000),
        ("small chat", 32, 2000),
        ("64-token stream", 1, 150),
        ("40K prompt repeated", 1, 50),
        ("40K prompts, each different", 1, 50),
    ]
    assert min(c.count for c in cases("m", 8, 32, 0.0001)) == 4
    assert goals(8, 32)[("small chat", 1)] == SMALL_GOALS
    assert goals(8, 32)[("small chat", 32)] == (Goal("kept_vs_peer", ">=", 0.8),)
    assert goals(8, 32)[("40K prompts, each different", 1)] == ()
    assert orjson.loads(plan[3].body())["stream"] is True and orjson.loads(plan[3].body())["max_tokens"] == 64


def test_goals_are_described_and_judged_both_ways() -> None:
    at_most, at_least = Goal("added_p50_ms", "<=", 0.5), Goal("kept_vs_peer", ">=", 0.8)
    assert at_most.describe() == "added p50 ≤ 0.5 ms" and at_most.met(0.5) and not at_most.met(0.51)
    assert at_least.describe() == "kept ≥ 0.8x sglang-router's kept" and at_least.met(0.8)
    assert not at_least.met(0.79)


def test_unique_prompts_are_the_same_sequence_in_every_run() -> None:
    a, b = cases("m", 16, 128, 1.0)[5], cases("m", 16, 128, 1.0)[5]
    assert [a.body() for _ in range(3)] == [b.body() for _ in range(3)]
