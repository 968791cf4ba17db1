"""Conversations replayed turn by turn through gateways, over chat or the Responses API (``bench.responses``).

A ``Chain`` is one conversation: its instructions and one question per turn, streamed or not
(``make_chains``, seeded). ``run_phase`` plays every chain of a ``Phase`` through its gateways,
``concurrency`` chains at once, each turn ``think_s`` after the answer to the one before (the client's
own time: reading, a tool running): turn k of chain c goes to gateway (c + k) mod n. Over chat each turn
sends the whole conversation in ``messages`` (the answers so far included); over Responses it sends the
question with ``previous_response_id`` (the gateway keeps the chain). A turn records whether it was
answered (a Responses status ``completed`` or ``incomplete``), the replica that answered it
(``x-kvroute-replica``), the replica's usage (input and cached tokens) and its latency; a failed turn ends
its chain. A ``Kill`` sends SIGKILL, once a given number of turns were
answered, to the process of the replica that answered the last of them. A progress line counts the turns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.runs.progress import Progress, stage
from bench.systems.fleet import EmulatorFleet
from bench.workloads.text import WordSource

MAX_OUTPUT_TOKENS = 48  # Responses; SGLang generates up to 46 (chat max_tokens 46)
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Chain:
    index: int
    instructions: str
    questions: tuple[str, ...]
    stream: bool


@dataclass(slots=True)
class Turn:
    chain: int
    turn: int
    ok: bool
    replica: str = ""
    input_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    after_kill: bool = False  # answered once the phase's replica was killed
    error: str = ""


@dataclass
class Kill:
    """SIGKILL, once ``at`` turns are answered, to the process of the replica that answered the last one
    (so chains in flight lose their replica)."""

    fleets: list[EmulatorFleet]
    at: int
    victim: str = ""  # its URL, once killed

    @property
    def done(self) -> bool:
        return bool(self.victim)

    def due(self, answered: int, replica: str) -> bool:
        if self.done or answered < self.at:
            return False
        fleet = next((f for f in self.fleets if f.urls[0] == replica), self.fleets[0])
        self.victim = fleet.urls[0]
        if fleet.pid is not None:
            os.kill(fleet.pid, signal.SIGKILL)
        return True


@dataclass
class Phase:
    name: str
    mode: str  # chat | responses
    model: str
    gateways: list[str]
    kill: Kill | None = None
    turns: list[Turn] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    progress: Progress | None = None

    def record(self, turn: Turn) -> None:
        turn.after_kill = self.killed
        self.turns.append(turn)
        answered = len(self.turns)
        if self.kill is not None and self.kill.due(answered, turn.replica):
            stage(f"{self.name}: replica {self.kill.victim} killed after {answered} turns")
        if self.progress is not None:
            self.progress.advance(error=not turn.ok)

    @property
    def killed(self) -> bool:
        return self.kill is not None and self.kill.done


def make_chains(
    n: int, turns: int, seed: int, instruction_tokens: int, question_tokens: int, streamed: float
) -> list[Chain]:
    words = WordSource(seed)
    return [
        Chain(
            i,
            words.document(f"Brief {i}", instruction_tokens),
            tuple(words.sentences(question_tokens) for _ in range(turns)),
            int((i + 1) * streamed) > int(i * streamed),
        )
        for i in range(n)
    ]


def _usage(doc: Any, mode: str) -> tuple[int, int]:
    """(input tokens, cached tokens) of a chat or Responses usage."""
    u = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(u, dict):
        return 0, 0
    key, details = (
        ("input_tokens", "input_tokens_details")
        if mode == "responses"
        else ("prompt_tokens", "prompt_tokens_details")
    )
    cached = u.get(details) or {}
    return int(u.get(key) or 0), int(cached.get("cached_tokens") or 0)


def _events(raw: bytes) -> list[Any]:
    out = []
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if data and data[0] != b"[DONE]":
            out.append(orjson.loads(data[0]))
    return out


def _answer(raw: bytes, mode: str, stream: bool) -> tuple[dict[str, Any] | None, str]:
    """The response (Responses) or a chat message summary: (doc with usage, text); None when failed."""
    if not stream:
        doc = orjson.loads(raw)
        if mode == "responses":
            return (doc if doc.get("status") in ("completed", "incomplete") else None), ""
        return doc, str(doc["choices"][0]["message"].get("content") or "")
    events = _events(raw)
    if mode == "responses":
        final = [
            e["response"] for e in events if e.get("type") in ("response.completed", "response.incomplete")
        ]
        return (final[-1] if final else None), ""
    text = "".join(
        str((c.get("delta") or {}).get("content") or "") for e in events for c in e.get("choices") or []
    )
    usage = [e for e in events if e.get("usage")]
    return (usage[-1] if usage else None), text


def _body(phase: Phase, chain: Chain, k: int, state: dict[str, Any]) -> tuple[str, bytes]:
    stream = chain.stream and phase.kill is None
    if phase.mode == "responses":
        body: dict[str, Any] = {
            "model": phase.model,
            "input": chain.questions[k],
            "instructions": chain.instructions,
            "max_output_tokens": MAX_OUTPUT_TOKENS,
            "stream": stream,
        }
        if state.get("previous"):
            body["previous_response_id"] = state["previous"]
        return "/v1/responses", orjson.dumps(body)
    state.setdefault("messages", [{"role": "system", "content": chain.instructions}])
    state["messages"].append({"role": "user", "content": chain.questions[k]})
    body = {
        "model": phase.model,
        "messages": state["messages"],
        "max_tokens": MAX_OUTPUT_TOKENS - 2,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", orjson.dumps(body)


async def _turn(
    http: aiohttp.ClientSession, phase: Phase, chain: Chain, k: int, state: dict[str, Any]
) -> Turn:
    gateway = phase.gateways[(chain.index + k) % len(phase.gateways)]
    path, body = _body(phase, chain, k, state)
    turn = Turn(chain.index, k, False)
    t0 = time.perf_counter()
    try:
        async with http.post(gateway + path, data=body, headers={"Content-Type": "application/json"}) as r:
            raw, turn.replica = await r.read(), r.headers.get("x-kvroute-replica", "")
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        turn.error = type(e).__name__
        return turn
    turn.latency_s = time.perf_counter() - t0
    doc, text = _answer(raw, phase.mode, b'"stream":true' in body) if status == 200 else (None, "")
    if doc is None:
        turn.error = f"HTTP {status}" if status != 200 else "no final response"
        return turn
    turn.ok = True
    turn.input_tokens, turn.cached_tokens = _usage(doc, phase.mode)
    if phase.mode == "responses":
        state["previous"] = doc["id"]
    else:
        state["messages"].append({"role": "assistant", "content": text})
    return turn


async def run_phase(
    phase: Phase, chains: Sequence[Chain], concurrency: int, cap_s: float, think_s: float = 0.0
) -> None:
    """Every chain through the phase's gateways (module docstring), a turn ``think_s`` after the answer
    before it; no chain starts after ``cap_s``."""
    queue = list(reversed(chains))
    phase.progress = Progress(phase.name, sum(len(c.questions) for c in chains))
    deadline = time.monotonic() + cap_s

    async def worker(http: aiohttp.ClientSession) -> None:
        while queue and time.monotonic() < deadline:
            chain, state = queue.pop(), dict[str, Any]()
            for k in range(len(chain.questions)):
                if k and think_s:
                    await asyncio.sleep(think_s)
                turn = await _turn(http, phase, chain, k, state)
                phase.record(turn)
                if not turn.ok:
                    break

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)
    ) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    phase.progress.close()
