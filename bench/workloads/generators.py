"""Seeded workload generators for the fleet benchmark.

Each generator is a pure function of (seed, fleet shape, quick) and returns a `Workload`: a tuple of
`TimedRequest`s (the types: bench/workloads/shapes.py; the RAG generators: bench/workloads/rag.py; both
re-exported here, every generator registered in `GENERATORS`). Times are *modelled* seconds (the
runner multiplies them by the time scale). A request either arrives at `arrival_s` (open loop) or, when
`after` is set, `think_s` after the request it follows has completed (closed loop within an agent
session or a sequential probe). A workload may also carry `outages` (rag_restart): replicas killed and
brought back at a fraction of its arrival span (bench/runs/outages.py).

Open-loop workloads (`Workload.sweep`: rag, rag_user, rag_restart, rag_tenants, mixed, hot, noreuse)
are generated at a nominal rate and then rescaled to an offered load by `bench.workloads.load.at_load`; the
closed-loop ones (agent, probe) run at their own pace.

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
from collections.abc import Callable
from typing import Any

from bench.workloads.rag import (
    RAG_DOC_TOKENS,
    RAG_INSTRUCTION,
    TENANTS,
    rag,
    rag_documents,
    rag_messages,
    rag_restart,
    rag_tenants,
    rag_user,
)
from bench.workloads.shapes import (
    CHAT,
    COMPLETIONS,
    MODEL,
    OUTPUT_MAX,
    OUTPUT_MIN,
    Builder,
    FleetShape,
    Outage,
    TimedRequest,
    Workload,
    chat,
    output_tokens,
    tokens_of,
)
from bench.workloads.text import WordSource, estimate_tokens

__all__ = [
    "AGENT_REPLY_TOKENS", "CHAT", "COMPLETIONS", "GENERATORS", "MODEL", "OUTPUT_MAX", "OUTPUT_MIN",
    "RAG_DOC_TOKENS", "RAG_INSTRUCTION", "TENANTS", "FleetShape", "Outage", "TimedRequest", "Workload",
    "agent", "build", "hot", "mixed", "noreuse", "output_tokens", "probe", "rag", "rag_documents",
    "rag_messages", "rag_restart", "rag_tenants", "rag_user",
]  # fmt: skip

AGENT_REPLY_TOKENS = 48


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
    out = Builder()
    start = 0.0
    for s in range(sessions):
        start += rng.expovariate(1.0 / gap)
        history: list[dict[str, Any]] = [{"role": "system", "content": system}]
        prev: int | None = None
        for t in range(turns):
            history.append({"role": "user", "content": f"Tool output {t}:\n" + words.sentences(step_tokens)})
            body = chat(list(history), output_tokens(rng), tools=tools, tool_choice="none")
            kw: dict[str, Any] = (
                {"after": prev, "think_s": rng.uniform(8.0, 16.0)} if prev is not None else {}
            )
            prev = out.add(start, f"agent-{s}", body, tokens_of(history) + 1500, f"turn{t}", **kw)
            history.append({"role": "assistant", "content": words.words(AGENT_REPLY_TOKENS)})
    return Workload("agent", agent.__doc__ or "", tuple(out.items), sessions=True, time_scale=0.1)


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
    out = Builder()
    prev: int | None = None

    def send(d: int, tag: str) -> None:
        nonlocal prev
        messages = [{"role": "user", "content": docs[d] + "\n\nSummarise the report in one line."}]
        kw: dict[str, Any] = {"after": prev, "think_s": 0.2} if prev is not None else {}
        prev = out.add(0.0, "probe", chat(messages, 8), doc_tokens + 20, tag, **kw)

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
    out = Builder()
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
    out = Builder()
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
        body = chat(messages, output_tokens(rng))
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
    out = Builder()
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        if rng.random() < 0.3:
            d = rng.randrange(ndocs)
            q = words.sentences(40)
            messages = [{"role": "system", "content": docs[d]}, {"role": "user", "content": q}]
            out.add(t, f"long-{i}", chat(messages, output_tokens(rng)), doc_tokens + 60, "long")
        else:
            q = words.sentences(rng.randint(20, 120))
            messages = [{"role": "system", "content": short_system}, {"role": "user", "content": q}]
            out.add(t, f"short-{i}", chat(messages, output_tokens(rng)), tokens_of(messages), "short")
    return Workload("mixed", mixed.__doc__ or "", tuple(out.items), sweep=True)


GENERATORS: dict[str, Callable[[int, FleetShape, bool], Workload]] = {
    "agent": agent,
    "rag": rag,
    "rag_user": rag_user,
    "rag_restart": rag_restart,
    "rag_tenants": rag_tenants,
    "probe": probe,
    "noreuse": noreuse,
    "hot": hot,
    "mixed": mixed,
}


def build(name: str, seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[name](seed, shape, quick)
