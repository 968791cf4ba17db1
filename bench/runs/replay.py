"""Replay a workload through one OpenAI endpoint and record what every request got.

Scheduling: a request without `after` is due at `arrival_s * time_scale` (open loop); a request with
`after` is due `think_s * time_scale` after the request it follows has finished (closed loop, whatever
the outcome). A semaphore caps requests in flight at `cap` (default CLIENT_CAP, far above what any
workload needs, so that the client never queues what an overloaded system should); a request that finds
it full is flagged `capped` and waits. The whole replay is bounded by a wall-clock deadline: requests not
yet sent are recorded as errors ("deadline"), requests still in flight are cancelled ("timeout").

Every request is streamed with `stream_options.include_usage`. Its TTFT (`ttft_s`) runs from when it was
due, its scheduled arrival, to the first SSE event that carries content (text, a content delta, a
tool-call delta or reasoning): whatever delayed it, in the client or the system, counts (no coordinated
omission). `send_ttft_s` runs from when it was sent and `wait_s` = sent - due. Times are recorded in
*modelled* seconds (wall seconds / time scale) so they read like the seeds' figures; the runner's own
CPU time is included in that, divided by the same scale.

A workload's timed fleet events (its outages, bench/runs/outages.py) run alongside as a task (`during`),
timed from the same start, and are cancelled when the replay ends.

The serving replica comes from the emulator's `x-emu-replica` header (relayed by a proxy), else
kvroute's `x-kvroute-replica`, else the URL the request was sent to.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from bench.runs.progress import Progress
from bench.systems.procs import replica_id
from bench.workloads.generators import TimedRequest, Workload

Chooser = Callable[[TimedRequest], str]
# awaited before a request is sent: (client session, request, body as sent, whether sessions are sticky)
Before = Callable[[aiohttp.ClientSession, TimedRequest, bytes, bool], Awaitable[None]]
# run alongside the replay (bench/runs/outages.py): (client session, t0 = the replay's start,
# perf_counter s)
During = Callable[[aiohttp.ClientSession, float], Coroutine[Any, Any, None]]
CLIENT_CAP = 1024


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    tag: str
    session: str
    status: int
    error: str
    due_s: float  # scheduled arrival, modelled seconds since the replay started
    sent_s: float  # when the client sent it
    ttft_s: float | None  # first content - due
    send_ttft_s: float | None  # first content - sent
    e2e_s: float | None  # last byte - sent
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    expected_prompt_tokens: int
    replica: str
    capped: bool = False  # it found the client's concurrency cap full and waited for a slot

    @property
    def wait_s(self) -> float:
        return self.sent_s - self.due_s

    @property
    def ok(self) -> bool:
        return not self.error and self.ttft_s is not None


@dataclass(slots=True)
class _Stream:
    ttft: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    def feed(self, event: dict[str, Any], now: float) -> None:
        if "error" in event and not event.get("choices"):
            err = event["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
        if self.ttft is None and any(_has_content(c) for c in event.get("choices") or ()):
            self.ttft = now
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)


def _has_content(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))


def stream_body(req: TimedRequest, model: str | None = None) -> bytes:
    """The request's body, streamed with usage; `model` replaces the workload's placeholder name."""
    body = dict(req.body)
    if model is not None and "model" in body:
        body["model"] = model
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    req: TimedRequest,
    scale: float,
    t0: float,
    sticky: bool = False,
    model: str | None = None,
    due: float | None = None,
) -> Record:
    """Send one streamed request; never raises for HTTP or protocol failures.

    `sticky`: send the session id as `x-session-id` (multi-turn workloads; routers may use it).
    `due`: its scheduled arrival (perf_counter seconds; default: now), where its TTFT starts.
    """
    start = time.perf_counter()
    due = start if due is None else min(due, start)
    headers = {"content-type": "application/json"}
    if sticky:
        headers["x-session-id"] = req.session
    state = _Stream()
    status, replica = 0, replica_id(base_url)
    try:
        async with session.post(base_url + req.path, data=stream_body(req, model), headers=headers) as resp:
            status = resp.status
            replica = replica_id(
                resp.headers.get("x-emu-replica") or resp.headers.get("x-kvroute-replica") or base_url
            )
            if status != 200:
                state.error = f"HTTP {status}: {(await resp.text())[:160]}"
            else:
                await _read_events(resp, state, start)
    except (aiohttp.ClientError, TimeoutError) as exc:
        state.error = f"{type(exc).__name__}: {exc}"[:200]
    end = time.perf_counter()
    if state.ttft is None and not state.error:
        state.error = "no content in stream"
    return Record(
        index=req.index,
        tag=req.tag,
        session=req.session,
        status=status,
        error=state.error,
        due_s=(due - t0) / scale,
        sent_s=(start - t0) / scale,
        ttft_s=None if state.ttft is None else (state.ttft - due) / scale,
        send_ttft_s=None if state.ttft is None else (state.ttft - start) / scale,
        e2e_s=(end - start) / scale,
        prompt_tokens=state.prompt_tokens,
        cached_tokens=state.cached_tokens,
        completion_tokens=state.completion_tokens,
        expected_prompt_tokens=req.expected_prompt_tokens,
        replica=replica,
    )


async def _read_events(resp: aiohttp.ClientResponse, state: _Stream, start: float) -> None:
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        state.feed(orjson.loads(data), time.perf_counter())


def _failed(req: TimedRequest, error: str, due_s: float = 0.0) -> Record:
    return Record(
        req.index, req.tag, req.session, 0, error, due_s, due_s, None, None, None, 0, 0, 0,
        req.expected_prompt_tokens, "",
    )  # fmt: skip


class Replay:
    """One replay of a workload against a chooser of base URLs; `before(session, req, body, headers)`,
    when given, is awaited just before each request is sent (bench.systems.gateway_pool's route previews);
    `during(session, t0)`, when given, runs as a task from the start (t0) until it returns or the replay
    ends, when it is cancelled (bench/runs/outages.py's timed faults); an error it raised is raised at
    the end."""

    def __init__(
        self,
        workload: Workload,
        choose: Chooser,
        scale: float,
        deadline_s: float,
        progress: Progress,
        model: str | None,
        cap: int = CLIENT_CAP,
        before: Before | None = None,
        during: During | None = None,
    ) -> None:
        self._w = workload
        self._during = during
        self._model = model
        self._choose = choose
        self._before = before
        self._scale = scale
        self._deadline = deadline_s
        self._progress = progress
        self._sem = asyncio.Semaphore(cap)
        self._records: dict[int, Record] = {}
        self._children: dict[int, list[TimedRequest]] = {}
        for r in workload.requests:
            if r.after is not None:
                self._children.setdefault(r.after, []).append(r)
        self._tasks: set[asyncio.Task[None]] = set()
        self._t0 = 0.0

    async def run(self, session: aiohttp.ClientSession) -> list[Record]:
        self._t0 = time.perf_counter()
        side = asyncio.create_task(self._during(session, self._t0)) if self._during else None
        try:
            await self._requests(session)
        finally:
            if side is not None:
                side.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await side  # an error it raised (not its cancellation) propagates
        return [self._records.get(r.index) or _failed(r, "deadline", r.arrival_s) for r in self._w.requests]

    async def _requests(self, session: aiohttp.ClientSession) -> None:
        for r in self._w.requests:
            if r.after is None:
                self._spawn(session, r, r.arrival_s * self._scale)
        end = self._t0 + self._deadline
        while self._tasks and time.perf_counter() < end:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, end - time.perf_counter()))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, session: aiohttp.ClientSession, req: TimedRequest, at: float) -> None:
        task = asyncio.create_task(self._one(session, req, at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, session: aiohttp.ClientSession, req: TimedRequest, at: float) -> None:
        stage, due = "deadline", self._t0 + at
        try:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            capped = self._sem.locked()
            async with self._sem:
                stage = "timeout"
                if self._before is not None:
                    await self._before(session, req, stream_body(req, self._model), self._w.sessions)
                rec = await send_one(
                    session, self._choose(req), req, self._scale, self._t0, self._w.sessions, self._model, due
                )
            self._records[req.index] = replace(rec, capped=capped)
        except asyncio.CancelledError:
            self._records[req.index] = _failed(req, stage, at / self._scale)
            raise
        self._progress.advance(error=bool(self._records[req.index].error))
        now = time.perf_counter() - self._t0
        for child in self._children.get(req.index, ()):
            self._spawn(session, child, now + child.think_s * self._scale)


async def replay(
    workload: Workload,
    choose: Chooser,
    scale: float,
    deadline_s: float,
    progress: Progress,
    model: str | None = None,
    request_timeout_s: float = 600.0,
    cap: int = CLIENT_CAP,
    before: Before | None = None,
    during: During | None = None,
) -> list[Record]:
    """Replay `workload`; `choose(req)` gives the base URL (a proxy's, or a replica's for client-side RR)."""
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        run = Replay(workload, choose, scale, deadline_s, progress, model, cap, before, during)
        return await run.run(session)


def rotating(urls: Sequence[str]) -> Chooser:
    """Client-side round robin with no proxy: the i-th request sent goes to urls[i % n]."""
    counter = iter(range(1 << 62))
    return lambda _req: urls[next(counter) % len(urls)]
