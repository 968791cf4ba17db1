"""The RAG workloads: questions about tens of ~6K-token documents (bench/workloads/generators.py registers
them).

`rag` puts the document in the system message, `rag_user` in the user message before the question;
both ask the same questions about the same documents at the same times for a seed. Two variants of
`rag` (the same documents, questions and arrivals):

- `rag_restart`: replica 0 is killed at 40% of the arrival span and comes back 10 modelled seconds
  later with an empty GPU and host cache (`RESTART`, an `Outage`; the replay injects it). What it
  measures here is the loss: the routers notice a replica's return by health checks on wall-clock
  intervals (kvroute every 5 s, sglang-router every 60 s), 5x longer in modelled time at the bench's
  time scale, and in the runs of 2026-12-02 no router sent a request to the replica once it was back
  before the last arrival. A longer rag does not help: bench.workloads.load packs its arrivals to the same
  offered load (500 questions spanned 37.6 modelled s against 200's 31.5);
- `rag_tenants`: each request belongs to one of two tenants (50/50, from a generator of its own seeded
  by the seed, so the arrivals stay rag's) and carries its `cache_salt`, a cache namespace in SGLang:
  one document asked by both tenants is two prefixes. Tags count a first question per (tenant, doc).
"""

from __future__ import annotations

import math
import random
from typing import Any

from bench.workloads.shapes import Builder, FleetShape, Outage, TimedRequest, Workload, chat, output_tokens
from bench.workloads.text import WordSource, estimate_tokens

RAG_DOC_TOKENS = 6_000
RAG_INSTRUCTION = "Answer the question from the document."
RESTART = Outage(at_frac=0.4, replica=0, down_s=10.0)
TENANTS = ("tenant-a", "tenant-b")


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
    seed: int,
    shape: FleetShape,
    quick: bool,
    layout: str,
    count: int | None = None,
    tenants: random.Random | None = None,
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
    out, seen, t = Builder(), set(), 0.0
    for i in range(count):
        t += rng.expovariate(rate)
        d = rng.choices(range(ndocs), weights)[0]
        question = "Question: " + words.sentences(rng.randint(20, 80))
        salt = {} if tenants is None else {"cache_salt": tenants.choice(TENANTS)}
        body = chat(rag_messages(layout, docs[d], question), output_tokens(rng), **salt)
        tokens = doc_tokens + estimate_tokens(question) + 24
        key = (salt.get("cache_salt"), d)
        session = "-".join(["rag", *salt.values(), str(i)])
        out.add(t, session, body, tokens, "repeat" if key in seen else "first")
        seen.add(key)
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


def rag_restart(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """`rag` (the same requests) while replica 0 is killed at 40% of the arrival span and comes back 10
    modelled seconds later with an empty GPU and host cache."""
    reqs = _rag(seed, shape, quick, "system")
    desc = f"{rag_restart.__doc__} {_rag.__doc__}"
    return Workload("rag_restart", desc, reqs, sweep=True, outages=(RESTART,))


def rag_tenants(seed: int, shape: FleetShape, quick: bool = False) -> Workload:
    """`rag` asked by two tenants, each request's chosen at random (50/50) and sent as its `cache_salt`
    (the same document under two salts is two prefixes); sessions name the tenant."""
    reqs = _rag(seed, shape, quick, "system", tenants=random.Random(f"{seed}:tenants"))
    return Workload("rag_tenants", f"{rag_tenants.__doc__} {_rag.__doc__}", reqs, sweep=True)
