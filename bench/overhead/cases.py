"""The cases of the overhead bench (issue 40's five plus 128-way concurrency), their request bodies, and the
issue's target for kvroute in each.

Every body is generated deterministically. The long prompt is ``LONG_TOKENS`` words of three letters
drawn from a seeded generator, one space before each: the emulator's pseudo-tokenizer makes one token of
each, so ~40K tokens are ~160 KB of text (the issue's size; the emulator's context length is 262,144 by
default and its GPU pool larger than the prompt, so every request is accepted). ``unique_bodies`` puts
the request's number first (``Request N:``), from one counter per run shared by every target, so two
prompts share only their first few tokens (the chat template's opening and ``Request``): less than one
page (16 tokens) of the replica's radix cache and one block (256 characters) of kvroute's prefix hash,
and a few characters of sglang-router's radix tree, so nothing of the 40K tokens can be reused.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

LONG_TOKENS = 40_000
LONG_SEED = 40
Body = Callable[[], bytes]


@dataclass(frozen=True, slots=True)
class Goal:
    """The issue's target on one figure of kvroute's row: ``figure`` (``added_p50_ms``, ``added_p99_ms``, or
    ``kept_vs_peer``: kvroute's kept ratio over sglang-router's) at most (``<=``) or at least (``>=``)
    ``bound``."""

    figure: str
    op: str
    bound: float

    def met(self, value: float) -> bool:
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def describe(self) -> str:
        unit = "x sglang-router's kept" if self.figure == "kept_vs_peer" else " ms"
        what = {"added_p50_ms": "added p50", "added_p99_ms": "added p99", "kept_vs_peer": "kept"}[self.figure]
        return f"{what} {'≤' if self.op == '<=' else '≥'} {self.bound:g}{unit}"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    concurrency: int
    count: int
    body: Body
    goals: tuple[Goal, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.concurrency


def long_text(tokens: int = LONG_TOKENS, seed: int = LONG_SEED) -> str:
    """``tokens`` words of three lowercase letters, each after a space (one pseudo-token each)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(" " + "".join(rng.choices(letters, k=3)) for _ in range(tokens))


def chat(model: str, content: str, stream: bool, max_tokens: int) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return orjson.dumps(body)


def unique_bodies(model: str, text: str) -> Body:
    """A new body at every call: the long text after a number no other call got."""
    numbers: Iterator[int] = itertools.count()
    return lambda: chat(model, f"Request {next(numbers)}:{text}", False, 8)


SMALL_GOALS = (Goal("added_p50_ms", "<=", 0.5), Goal("added_p99_ms", "<=", 1.0))
KEPT_GOALS = (Goal("kept_vs_peer", ">=", 0.8),)
# name, concurrency (1, "high" = --concurrency or "wide" = --wide), requests per target and run, body, goals
PLAN: tuple[tuple[str, int | str, int, str, tuple[Goal, ...]], ...] = (
    ("small chat", 1, 600, "small", SMALL_GOALS),
    ("small chat", "high", 2000, "small", KEPT_GOALS),
    ("small chat", "wide", 4000, "small", KEPT_GOALS),
    ("64-token stream", 1, 300, "stream", (Goal("added_p99_ms", "<=", 1.5),)),
    ("40K prompt repeated", 1, 100, "repeated", (Goal("added_p50_ms", "<=", 1.0),)),
    ("40K prompts, each different", 1, 100, "unique", ()),
)


def goals(high: int, wide: int) -> dict[tuple[str, int], tuple[Goal, ...]]:
    """(case, concurrency) -> the issue's targets for kvroute there."""
    level = {"high": high, "wide": wide}
    return {(name, c if isinstance(c, int) else level[c]): g for name, c, _, _, g in PLAN}


def cases(model: str, high: int, wide: int, scale: float, long_tokens: int = LONG_TOKENS) -> list[Case]:
    """The cases in the order they run; counts are per target and run (times ``scale``, at least 4)."""
    text = long_text(long_tokens)
    small, stream = chat(model, "Say hi.", False, 8), chat(model, "Count to 64.", True, 64)
    repeated = chat(model, "Repeat after me:" + text, False, 8)
    bodies: dict[str, Body] = {
        "small": lambda: small,
        "stream": lambda: stream,
        "repeated": lambda: repeated,
        "unique": unique_bodies(model, text),
    }
    level = {"high": high, "wide": wide}
    return [
        Case(name, c if isinstance(c, int) else level[c], max(4, int(k * scale)), bodies[body], g)
        for name, c, k, body, g in PLAN
    ]
