"""The workload components a scenario mixes, each drawn from its own seeded generator.

Every component returns ``Draft`` requests on a nominal timeline of ``span`` seconds (the scenario
rescales it to its offered load afterwards, bench/workloads/load.py): an open-loop draft has an arrival time;
a session's later turns follow the previous turn (``prev``) after a think time. Bodies are built with
``bench.workloads.shapes.chat`` (streamed chat bodies as the benchmark sends them) and text comes from
``bench.workloads.text.WordSource``; RAG messages are ``bench.workloads.rag.rag_messages`` (the document in
the system message or in the user message before the question). Output lengths are log-uniform in
``OUTPUT_MIN``-``OUTPUT_MAX`` tokens.

- ``rag``: questions about documents of Zipf popularity; documents are written when first asked about,
  so a large catalogue costs nothing until used. Optionally two tenants (``cache_salt``).
- ``sessions``: agent or coding sessions. All share a prefix (an agent's system prompt and tools; a
  coding session's system prompt and one of a few repositories, each a good part of a GPU pool, so
  the repositories together outgrow one replica); each turn appends a tool output or a diff and the
  stand-in of the previous reply; with or without an ``x-session-id`` header.
- ``burst``: a document nobody asked about turns hot: many questions on it in a short window, while
  other documents get a few questions each over the whole span.
- ``chat``: short conversations with a small shared system prompt (little to reuse).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.workloads.rag import rag_messages
from bench.workloads.shapes import chat
from bench.workloads.text import WordSource

OUTPUT_MIN, OUTPUT_MAX = 16, 1024
REPLY_TOKENS = (
    48  # a session's stand-in of its previous reply (bench.workloads.generators.AGENT_REPLY_TOKENS)
)


@dataclass(slots=True, eq=False)
class Draft:
    arrival_s: float
    body: dict[str, Any]
    tag: str
    tokens: int  # estimated prompt tokens
    session: str | None = None  # the x-session-id header value, None: no header
    prev: Draft | None = None  # closed loop: sent think_s after this one's answer ended
    think_s: float = 0.0


def output_tokens(rng: random.Random) -> int:
    return round(math.exp(rng.uniform(math.log(OUTPUT_MIN), math.log(OUTPUT_MAX))))


def arrivals(rng: random.Random, count: int, span: float) -> list[float]:
    """``count`` Poisson arrivals conditioned on [0, span]: sorted uniform times."""
    return sorted(rng.uniform(0.0, span) for _ in range(count))


class Library:
    """Documents written on first use, each of its own drawn size (same seed, same texts)."""

    def __init__(self, seed: int, title: str, sizes: list[int]) -> None:
        self._words, self._title, self.sizes = WordSource(seed), title, sizes
        self._docs: dict[int, str] = {}

    def get(self, d: int) -> str:
        if d not in self._docs:
            self._docs[d] = self._words.document(f"{self._title} {d}", self.sizes[d])
        return self._docs[d]


@dataclass(frozen=True, slots=True)
class RagParams:
    count: int
    docs: int
    doc_tokens: tuple[int, int]  # sizes drawn in this range
    zipf_s: float
    layout: str  # "system" | "user"
    tenants: bool


def rag(seed: int, p: RagParams, span: float) -> list[Draft]:
    rng, words = random.Random(seed), WordSource(seed + 1)
    library = Library(seed + 2, "Document", [rng.randint(*p.doc_tokens) for _ in range(p.docs)])
    weights = [1.0 / (k**p.zipf_s) for k in range(1, p.docs + 1)]
    out, seen = [], set()
    for t in arrivals(rng, p.count, span):
        d = rng.choices(range(p.docs), weights)[0]
        salt = {"cache_salt": rng.choice(("tenant-a", "tenant-b"))} if p.tenants else {}
        question = "Question: " + words.sentences(rng.randint(20, 80))
        body = chat(rag_messages(p.layout, library.get(d), question), output_tokens(rng), stream=True, **salt)
        key = (salt.get("cache_salt"), d)
        out.append(Draft(t, body, "rag-repeat" if key in seen else "rag-first", library.sizes[d] + 100))
        seen.add(key)
    return out


@dataclass(frozen=True, slots=True)
class SessionParams:
    count: int  # requests: sessions start until this many turns are drawn
    turns: int
    kind: str  # "agent" | "coding"
    prefix_tokens: int  # the system prompt (and tools) every session shares
    repos: int  # coding: repositories, one per session drawn among them
    repo_tokens: int
    step_tokens: tuple[int, int]  # what a turn appends (a tool output, a diff)
    think_s: tuple[float, float]
    header: bool
    max_prompt_tokens: int  # a session ends before its prompt would outgrow this


def sessions(seed: int, p: SessionParams, span: float) -> list[Draft]:
    """Sessions start at uniform times until ``p.count`` turns are drawn (fewer if not even a first turn
    fits ``max_prompt_tokens``)."""
    rng, words = random.Random(seed), WordSource(seed + 1)
    system = f"You are a {p.kind} assistant. " + words.sentences(p.prefix_tokens)
    repos = Library(seed + 2, "Repository", [p.repo_tokens] * p.repos)
    out: list[Draft] = []
    while len(out) < p.count:
        history = [{"role": "system", "content": system}]
        if p.kind == "coding":
            history.append({"role": "user", "content": "Repository:\n" + repos.get(rng.randrange(p.repos))})
        header = f"{p.kind}-{seed}-{len(out)}" if p.header else None
        turns = _turns(rng, words, p, history, rng.uniform(0.0, span), header, p.count - len(out))
        if not turns:
            break
        out += turns
    return out


def _turns(
    rng: random.Random,
    words: WordSource,
    p: SessionParams,
    history: list[dict[str, str]],
    start: float,
    header: str | None,
    most: int,
) -> list[Draft]:
    """One session's turns: each appends a tool output or a diff to the history, then the stand-in
    of its reply; the session ends after ``p.turns`` turns or before its prompt outgrows the cap."""
    tokens = p.prefix_tokens + (p.repo_tokens if p.kind == "coding" else 0)
    label = "Tool output" if p.kind == "agent" else "Diff"
    out: list[Draft] = []
    prev: Draft | None = None
    for t in range(min(p.turns, most)):
        step = rng.randint(*p.step_tokens)
        if tokens + step + REPLY_TOKENS + OUTPUT_MAX > p.max_prompt_tokens:
            break
        history.append({"role": "user", "content": f"{label} {t}:\n" + words.sentences(step)})
        tokens += step
        think = rng.uniform(*p.think_s) if prev is not None else 0.0
        prev = Draft(start, chat(list(history), output_tokens(rng), stream=True), f"{p.kind}-turn", tokens,
                     header, prev, think)  # fmt: skip
        out.append(prev)
        history.append({"role": "assistant", "content": words.words(REPLY_TOKENS)})
        tokens += REPLY_TOKENS
    return out


@dataclass(frozen=True, slots=True)
class BurstParams:
    count: int
    doc_tokens: int
    at_frac: float  # where in the span the document turns hot
    width_frac: float  # how long the burst lasts, as a fraction of the span
    background: int  # questions on other documents (a few questions each), spread over the span


def burst(seed: int, p: BurstParams, span: float) -> list[Draft]:
    rng, words = random.Random(seed), WordSource(seed + 1)
    others = max(1, p.background // 4)
    library = Library(seed + 2, "Report", [p.doc_tokens] * (others + 1))
    start, width = p.at_frac * span, p.width_frac * span
    times = [(start + rng.uniform(0.0, width), 0) for _ in range(p.count)]
    times += [(t, 1 + rng.randrange(others)) for t in arrivals(rng, p.background, span)]
    out = []
    for t, d in sorted(times):
        question = "Question: " + words.sentences(rng.randint(20, 60))
        body = chat(rag_messages("system", library.get(d), question), output_tokens(rng), stream=True)
        out.append(Draft(t, body, "burst-hot" if d == 0 else "burst-cold", p.doc_tokens + 80))
    return out


def short_chat(seed: int, count: int, span: float) -> list[Draft]:
    rng, words = random.Random(seed), WordSource(seed + 1)
    system = "You are a helpful assistant. " + words.sentences(rng.randint(200, 800))
    out = []
    for t in arrivals(rng, count, span):
        size = rng.randint(50, 1500)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": words.sentences(size)}]
        out.append(Draft(t, chat(messages, output_tokens(rng), stream=True), "chat", size + 300))
    return out


Component = Callable[[int, float], list[Draft]]
