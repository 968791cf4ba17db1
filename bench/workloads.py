"""Seeded workload generators for the fleet benchmark.

Each generator is a pure function of (seed, fleet shape, quick) and returns a `Workload`: a tuple of
`TimedRequest`s. Times are *modelled* seconds (the runner multiplies them by the time scale). A request
either arrives at `arrival_s` (open loop) or, when `after` is set, `think_s` after the request it follows
has completed (closed loop within an agent session or a sequential probe).

Open-loop workloads (`Workload.sweep`: rag, rag_user, mixed, hot, noreuse) are generated at a nominal
rate and then rescaled to an offered load by `bench.load.at_load`; the closed-loop ones (agent, probe)
run at their own pace.

Sizes follow the fleet: every workload's working set exceeds the fleet's GPU pools (sum over replicas)
but fits GPU + host, so placement decides whether a repeat is a GPU hit, a host reload or a cold
prefill. Output lengths (`max_tokens`, which the emulator always fills) are log-uniform in
[OUTPUT_MIN, OUTPUT_MAX] from the workload's own seeded generator, except the probe's (8 tokens: it
measures prefill only).

Agent replies: turn k's prompt contains the history of turns < k, where each earlier assistant reply
is a deterministic stand-in of fixed length (`AGENT_REPLY_TOKENS`) rather than the text the server
returned. This keeps every system's byte stream identical and the workload a pure function of the
seed; the cost is that the previous reply's tokens are a miss on every turn (the engine cached its
own output, not the stand-in), which is the same for every system.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.text import WordSource, estimate_tokens

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "default"
AGENT_REPLY_TOKENS = 48
OUTPUT_MIN, OUTPUT_MAX = 32, 512
RAG_DOC_TOKENS = 6_000
RAG_INSTRUCTION = "Answer the question from the document."


@dataclass(frozen=True, slots=True)
class FleetShape:
    """What the workloads are sized against: per-replica pools in tokens."""

    replicas: int
    gpu_tokens: int
    host_tokens: int

    @property
    def fleet_gpu(self) -> int:
        return self.replicas * self.gpu_tokens

    @property
    def fleet_total(self) -> int:
        return self.replicas * (self.gpu_tokens + self.host_tokens)


@dataclass(frozen=True, slots=True)
class TimedRequest:
    index: int
    arrival_s: float
    session: str
    path: str
    body: Mapping[str, Any] = field(hash=False, compare=True)
    expected_prompt_tokens: int
    tag: str
    after: int | None = None
    think_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    requests: tuple[TimedRequest, ...]
    sessions: bool = False  # send `x-session-id` (real multi-turn sessions only)
    time_scale: float = 0.2  # default wall seconds per modelled second (keeps the fleet's CPU load modest)
    sweep: bool = False  # open loop: arrivals can be rescaled to an offered load (bench.load)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.expected_prompt_tokens for r in self.requests)


def output_tokens(rng: random.Random) -> int:
    """A log-uniform length in [OUTPUT_MIN, OUTPUT_MAX]: exp(uniform(ln min, ln max)), rounded."""
    return round(math.exp(rng.uniform(math.log(OUTPUT_MIN), math.log(OUTPUT_MAX))))


def _chat(messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **extra}


def _tokens_of(messages: list[dict[str, Any]]) -> int:
    return sum(estimate_tokens(str(m.get("content", ""))) + 5 for m in messages) + 3


class _Builder:
    """Accumulates requests with consecutive indexes."""

    def __init__(self) -> None:
        self.items: list[TimedRequest] = []

    def add(
        self, arrival: float, session: str, body: dict[str, Any], tokens: int, tag: str, **kw: Any
    ) -> int:
        index = len(self.items)
        path = CHAT if "messages" in body else COMPLETIONS
        self.items.append(TimedRequest(index, arrival, session, path, body, tokens, tag, **kw))
        return index


def _tools(words: WordSource, count: int) -> list[dict[str, Any]]:
    tools = []
    for i in range(count):
        props = {f"arg_{j}": {"type": "string", "description": words.sentences(20)} for j in range(4)}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}_{words.words(1).replace(' ', '_')}",
                    "description": words.sentences(60),
                    "parameters": {"type": "object", "properties": props, "required": ["arg_0"]},
                },
            }
        )
    return tools


def agent(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """Multi-turn agent sessions sharing one long system prompt and tool schemas.

    Sessions start open loop (exponential gaps); each turn follows the previous one after a think time
    (tools running, a human reading) and appends a tool output plus the stand-in reply of the previous
    turn. About 20 sessions are live at once and their histories together (~1.1x the fleet's GPU pools)
    overflow one replica's GPU + host but fit the fleet when each session stays on one replica.
    """
    words = WordSource(seed)
    rng = words.rng
    sessions, turns, gap = (12, 4, 3.0) if quick else (32, 8, 4.5)
    system = "You are a coding agent. " + words.sentences(3500)
    tools = _tools(words, 8)
    step_tokens = max(200, int(0.013 * shape.fleet_gpu))
    out = _Builder()
    start = 0.0
    for s in range(sessions):
        start += rng.expovariate(1.0 / gap)
        history: list[dict[str, Any]] = [{"role": "system", "content": system}]
        prev: int | None = None
        for t in range(turns):
            history.append({"role": "user", "content": f"Tool output {t}:\n" + words.sentences(step_tokens)})
            body = _chat(list(history), output_tokens(rng), tools=tools, tool_choice="none")
            kw: dict[str, Any] = (
                {"after": prev, "think_s": rng.uniform(8.0, 16.0)} if prev is not None else {}
            )
            prev = out.add(start, f"agent-{s}", body, _tokens_of(history) + 1500, f"turn{t}", **kw)
            history.append({"role": "assistant", "content": words.words(AGENT_REPLY_TOKENS)})
    return Workload("agent", agent.__doc__ or "", tuple(out.items), sessions=True, time_scale=0.1)


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, n + 1)]


def rag_messages(layout: str, document: str, question: str) -> list[dict[str, Any]]:
    """The two ways RAG frameworks place a retrieved document: in the system message ("system", the
    question alone in the user turn), or in the user message before the question ("user", after a short
    system instruction; what many frameworks' default prompts build)."""
    if layout == "system":
        return [
            {"role": "system", "content": RAG_INSTRUCTION + "\n\n" + document},
            {"role": "user", "content": question},
        ]
    if layout == "user":
        return [
            {"role": "system", "content": RAG_INSTRUCTION},
            {"role": "user", "content": "Document:\n" + document + "\n\n" + question},
        ]
    raise ValueError(f"unknown rag layout {layout!r}; known: system, user")


def _rag_documents(words: WordSource, shape: FleetShape) -> tuple[int, list[str]]:
    """(tokens per document, the documents): 1.6x the fleet's GPU pools of ~6K-token documents."""
    doc_tokens = min(RAG_DOC_TOKENS, shape.gpu_tokens // 4)
    ndocs = max(8, math.ceil(1.6 * shape.fleet_gpu / doc_tokens))
    return doc_tokens, [words.document(f"Document {d}", doc_tokens) for d in range(ndocs)]


def rag_documents(seed: int, shape: FleetShape) -> list[str]:
    """The documents `rag` and `rag_user` ask about for this seed and fleet (the same texts, in order;
    `rag_messages` builds a request's messages from one)."""
    return _rag_documents(WordSource(seed), shape)[1]


def _rag(
    seed: int, shape: FleetShape, quick: bool, layout: str, count: int | None = None
) -> tuple[TimedRequest, ...]:
    """Questions about tens of ~6K-token documents with Zipf(0.9) popularity, arriving at a steady
    rate from the start (while documents are first seen); the documents together are 1.6x the fleet's
    GPU pools. Tags: "first" (a document's first question), "repeat". `count` requests (default 200,
    quick 80): a longer run extends the same one (its first 200 are the default's)."""
    words = WordSource(seed)
    rng = words.rng
    doc_tokens, docs = _rag_documents(words, shape)
    ndocs = len(docs)
    weights = _zipf_weights(ndocs, 0.9)
    count, rate = count or (80 if quick else 200), 4.0
    out, seen, t = _Builder(), set(), 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        d = rng.choices(range(ndocs), weights)[0]
        question = "Question: " + words.sentences(rng.randint(20, 80))
        body = _chat(rag_messages(layout, docs[d], question), output_tokens(rng))
        tokens = doc_tokens + estimate_tokens(question) + 24
        out.add(t, f"rag-{i}", body, tokens, "repeat" if d in seen else "first")
        seen.add(d)
    return tuple(out.items)


def rag(seed: int, shape: FleetShape, quick: bool = False, count: int | None = None) -> Workload:
    """RAG with the document in the system message and the question in the user message."""
    reqs = _rag(seed, shape, quick, "system", count)
    return Workload("rag", f"{rag.__doc__} {_rag.__doc__}", reqs, sweep=True)


def rag_user(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """RAG with the document in the user message, before the question (the same documents, questions
    and arrivals as `rag` for a seed)."""
    reqs = _rag(seed, shape, quick, "user")
    return Workload("rag_user", f"{rag_user.__doc__} {_rag.__doc__}", reqs, sweep=True)


def probe(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """The seeds' eviction-reuse probe at fleet scale, sent sequentially (one request at a time).

    Phase cold: `k` tracked documents; phase pressure: unique documents until the working set is past
    the fleet's GPU pools (and past one replica's GPU + host) but within the fleet's GPU + host; then
    the tracked documents again (resend1) and again (resend2).
    """
    words = WordSource(seed)
    doc_tokens = max(1024, shape.gpu_tokens // 3)
    k = 2 if quick else 4
    target = max(1.25 * shape.fleet_gpu, 1.1 * (shape.gpu_tokens + shape.host_tokens))
    target = min(target, 0.8 * shape.fleet_total)
    pressure = max(1, math.ceil(target / doc_tokens) - k)
    docs = [words.document(f"Report {d}", doc_tokens) for d in range(k + pressure)]
    out = _Builder()
    prev: int | None = None

    def send(d: int, tag: str) -> None:
        nonlocal prev
        messages = [{"role": "user", "content": docs[d] + "\n\nSummarise the report in one line."}]
        kw: dict[str, Any] = {"after": prev, "think_s": 0.2} if prev is not None else {}
        prev = out.add(0.0, "probe", _chat(messages, 8), doc_tokens + 20, tag, **kw)

    for d in range(k):
        send(d, "cold")
    for d in range(k, k + pressure):
        send(d, "pressure")
    for phase in ("resend1", "resend2"):
        for d in range(k):
            send(d, phase)
    return Workload("probe", probe.__doc__ or "", tuple(out.items), time_scale=0.1)


def noreuse(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """Unique prompts only: nothing to reuse, placement can only balance load."""
    words = WordSource(seed)
    rng = words.rng
    count, rate = (60, 3.0) if quick else (200, 3.0)
    out = _Builder()
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        tokens = rng.randint(256, max(512, shape.gpu_tokens // 16))
        prompt = f"Request {i} {seed}: " + words.sentences(tokens)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": output_tokens(rng), "temperature": 0.0}
        out.add(t, f"noreuse-{i}", body, estimate_tokens(prompt), "unique")
    return Workload("noreuse", noreuse.__doc__ or "", tuple(out.items), sweep=True)


def hot(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """One very popular document hit by many concurrent clients, plus a trickle of other documents.

    Every client adds its own notes (500-1000 tokens) after the shared document, so even a perfect hit
    leaves real prefill work: piling the hot document onto one replica saturates its prefill engine.
    """
    words = WordSource(seed)
    rng = words.rng
    doc_tokens = max(1024, shape.gpu_tokens // 8)
    hot_doc = words.document("Hot document", doc_tokens)
    others = [words.document(f"Other {d}", doc_tokens) for d in range(12)]
    count, rate = (80, 6.0) if quick else (200, 6.0)
    out = _Builder()
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        is_hot = rng.random() < 0.8
        doc = hot_doc if is_hot else others[rng.randrange(len(others))]
        question = (
            "My notes:\n" + words.sentences(rng.randint(500, 1000)) + "\nQuestion: " + words.sentences(30)
        )
        messages = [{"role": "system", "content": doc}, {"role": "user", "content": question}]
        tokens = doc_tokens + estimate_tokens(question) + 15
        body = _chat(messages, output_tokens(rng))
        out.add(t, f"hot-{i}", body, tokens, "hot" if is_hot else "other")
    return Workload("hot", hot.__doc__ or "", tuple(out.items), sweep=True)


def mixed(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """Long-context requests (documents with reuse) interleaved with short chat turns."""
    words = WordSource(seed)
    rng = words.rng
    doc_tokens = max(2048, shape.gpu_tokens // 3)
    ndocs = max(4, math.ceil(1.3 * shape.fleet_gpu / doc_tokens))
    docs = [words.document(f"Contract {d}", doc_tokens) for d in range(ndocs)]
    short_system = "You are a helpful assistant. " + words.sentences(150)
    count, rate = (80, 3.0) if quick else (200, 3.0)
    out = _Builder()
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        if rng.random() < 0.3:
            d = rng.randrange(ndocs)
            q = words.sentences(40)
            messages = [{"role": "system", "content": docs[d]}, {"role": "user", "content": q}]
            out.add(t, f"long-{i}", _chat(messages, output_tokens(rng)), doc_tokens + 60, "long")
        else:
            q = words.sentences(rng.randint(20, 120))
            messages = [{"role": "system", "content": short_system}, {"role": "user", "content": q}]
            out.add(t, f"short-{i}", _chat(messages, output_tokens(rng)), _tokens_of(messages), "short")
    return Workload("mixed", mixed.__doc__ or "", tuple(out.items), sweep=True)


GENERATORS: dict[str, Callable[[int, FleetShape, bool], Workload]] = {
    "agent": agent,
    "rag": rag,
    "rag_user": rag_user,
    "probe": probe,
    "noreuse": noreuse,
    "hot": hot,
    "mixed": mixed,
}


def build(name: str, seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[name](seed, shape, quick)
