"""The fault-injection lab: an emulated fleet, a Redis and a fresh gateway per fault kind, one burst each.

``FaultLab`` owns three emulated replicas in two ``python -m emulator`` processes (the *victim* alone
in its own, so it can be killed, and two healthy ones) with ``--emu-enable-faults``, and one
``redis-server``; all are ours and stopped by PID. ``run_kind(lab, kind, n)`` starts a new in-process
gateway over the three replicas (``--state`` on the Redis for the two Redis kinds), injects the fault
and sends ``n`` chat requests (every other one streamed) at ``concurrency``, then reads the verdicts:

- **killed**: the victim's process gets SIGKILL once a third of the requests answered (and the
  gateway has requests in flight on it: the mid-run faults wait up to 2 s for that);
- **hung**, **fail** (500 then 503), **cut_stream** (3 before the first event, then after two events),
  **slow** (x20), **reset**: armed on the victim (``emulator/faults.py``) before the burst, for every
  request that reaches it (the breaker soon ejects it: then only its half-open trials do);
- **dropped**: the victim accepts the first ``DROPPED`` requests that reach it and never answers them,
  while it serves the rest: it keeps working, so a first-byte wait on it goes on past its deadline
  (``proxy/upstream/liveness.py``) until later requests overtake it (streamed) or at once (not streamed);
- **restart**: the victim restarts (cache lost, new start time) once a third answered;
- **redis_down** / **redis_flushed**: the Redis is stopped / emptied (FLUSHALL) once a third answered.

Each answer is classified (``classify``): *completed* (a whole answer, or a stream ending with
``[DONE]``), *failed early* (an error status, or a stream whose first event is an error: nothing was
streamed yet), *stream error* (data events, then exactly one SSE error event, the last or followed only
by ``[DONE]`` as SGLang sends it), or *lost*
(anything else: a dropped connection, a stream cut without an error, no answer within the client's
timeout). The targets: 0 lost and 0 failed early for every kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.systems.fleet import EmulatorFleet
from bench.systems.redis_proc import RedisServer
from proxy.config.settings import Settings
from proxy.context import GATEWAY
from proxy.runtime.serving import GatewayRunner
from proxy.server import build_app

KINDS = (
    "killed",
    "hung",
    "dropped",
    "fail",
    "cut_stream",
    "slow",
    "reset",
    "restart",
    "redis_down",
    "redis_flushed",
)
DROPPED = 6  # requests the victim accepts and never answers in the "dropped" kind
MODEL = "emu-model"
CLIENT_TIMEOUT_S = 30.0
BUSY_WAIT_S = 2.0
SYSTEM = "You are a careful assistant who answers in few words. " * 8
GATEWAY_SETTINGS = {  # deadlines and breaker sized for modelled time 50x faster (--emu-time-scale 0.02)
    "policy": "round_robin",  # the victim gets its third of the traffic whatever it holds
    "health_interval": 0.2,
    "retries": 2,
    "first_byte_timeout": 0.5,
    "first_byte_timeout_margin": 0.2,
    "decode_timeout_per_token": 0.02,
    "idle_timeout": 2.0,
    "breaker_cooldown": 1.0,
}
ARMED: dict[str, list[dict[str, Any]]] = {
    "hung": [{"action": "hang"}],
    "dropped": [{"action": "hang", "count": DROPPED}],
    "fail": [{"action": "fail", "status": 500}, {"action": "fail", "status": 503}],
    "cut_stream": [  # first 3 streams cut before their first event (retried), then after two (an SSE error)
        {"action": "cut_stream", "after_chunks": 0, "count": 3},
        {"action": "cut_stream", "after_chunks": 2},
    ],
    "slow": [{"action": "slow", "factor": 20}],
    "reset": [{"action": "reset"}],
}


@dataclass
class Tally:
    kind: str
    requests: int = 0
    completed: int = 0
    failed_early: int = 0
    stream_errors: int = 0
    lost: int = 0
    retries: int = 0
    upstream_errors: int = 0  # what the gateway met: evidence that the fault happened
    trips: int = 0  # circuit breaker openings
    slowest_s: float = 0.0  # the longest any request took, sent to answered (wall seconds)


class FaultLab:
    """The replicas and the Redis of the fault runs (a sync context manager)."""

    def __init__(self, time_scale: float = 0.02) -> None:
        args = ["--served-model-name", MODEL, "--emu-time-scale", str(time_scale), "--emu-enable-faults"]
        args += ["--enable-cache-report", "--page-size", "16"]
        self.victim = EmulatorFleet(1, args)
        self.healthy = EmulatorFleet(2, args)
        self.redis = RedisServer()

    @property
    def urls(self) -> list[str]:
        return [*self.victim.urls, *self.healthy.urls]

    def __enter__(self) -> FaultLab:
        try:
            self.victim.start(), self.healthy.start(), self.redis.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.victim.close()
        self.healthy.close()
        self.redis.stop()

    def kill_victim(self) -> None:
        """SIGKILL to the victim's process (ours), then reap it."""
        if self.victim.pid is not None:
            os.kill(self.victim.pid, signal.SIGKILL)
        self.victim.close()

    async def prepare(self) -> None:
        """Everything back to normal before a kind: the victim alive, the Redis up, no fault armed."""
        if self.victim.pid is None:
            await asyncio.to_thread(self.victim.start)
        if self.redis.proc is None:
            await asyncio.to_thread(self.redis.start)
        async with aiohttp.ClientSession() as s:
            for url in self.urls:
                async with s.post(url + "/_emu/faults", json={"action": "clear"}) as r:
                    r.raise_for_status()

    async def arm(self, body: dict[str, Any]) -> None:
        async with aiohttp.ClientSession() as s, s.post(self.victim.urls[0] + "/_emu/faults", json=body) as r:
            r.raise_for_status()

    async def strike(self, kind: str) -> None:
        """The mid-run fault of ``kind`` (none for the armed kinds)."""
        if kind == "killed":
            await asyncio.to_thread(self.kill_victim)
        elif kind == "restart":
            await self.arm({"action": "restart"})
        elif kind == "redis_down":
            await asyncio.to_thread(self.redis.stop)
        elif kind == "redis_flushed":
            await asyncio.to_thread(lambda: self.redis.client().flushall())


@contextlib.asynccontextmanager
async def gateway(
    lab: FaultLab, kind: str, overrides: dict[str, Any]
) -> AsyncIterator[tuple[str, web.Application]]:
    """A new gateway over the lab's replicas (sharing state through the lab's Redis for its kinds)."""
    state = {"state": lab.redis.url} if kind.startswith("redis") else {}
    app = build_app(Settings(backends=tuple(lab.urls), **(GATEWAY_SETTINGS | state | overrides)))
    runner = GatewayRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app
    finally:
        await runner.cleanup()


def classify(status: int, body: bytes, streamed: bool) -> str:
    """completed | failed_early | stream_error | lost (see the module docstring)."""
    if status >= 400:
        return "failed_early"  # a whole error answer: the SDK raises a clean APIStatusError
    if not streamed:
        doc = _json(body)
        return "completed" if isinstance(doc, dict) and doc.get("choices") else "lost"
    events = [ln[6:] for ln in body.split(b"\n") if ln.startswith(b"data: ")]
    errors = [i for i, e in enumerate(events) if _is_error(e)]
    if errors and events[-1] == b"[DONE]" and errors[-1] == len(events) - 2:
        events.pop()  # SGLang's in-band error, then [DONE]: the SDK raises on the error event
    if events and events[-1] == b"[DONE]" and not errors:
        return "completed"
    if errors == [len(events) - 1]:
        return "stream_error" if len(events) > 1 else "failed_early"
    return "lost"


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _is_error(data: bytes) -> bool:
    doc = _json(data)
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict) and "message" in doc["error"]


async def _one(http: aiohttp.ClientSession, url: str, i: int) -> str:
    streamed = i % 2 == 0
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}],
        "max_tokens": 64,
        "stream": streamed,
    }
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            return classify(r.status, await r.read(), streamed)
    except (aiohttp.ClientError, TimeoutError):
        return "lost"


async def burst(
    lab: FaultLab, kind: str, url: str, n: int, concurrency: int, busy: Callable[[], bool]
) -> list[tuple[str, float]]:
    """``n`` requests at ``concurrency``, each one's verdict and seconds from sent to answered; the
    mid-run fault strikes when a third have answered and ``busy()`` (the victim has requests in flight;
    waited for at most ``BUSY_WAIT_S``)."""
    gate, done, verdicts = asyncio.Semaphore(concurrency), asyncio.Event(), []
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    loop = asyncio.get_running_loop()

    async def one(i: int, http: aiohttp.ClientSession) -> None:
        async with gate:
            t0 = loop.time()
            verdicts.append((await _one(http, url, i), loop.time() - t0))
        if len(verdicts) >= n // 3:
            done.set()

    async with aiohttp.ClientSession(timeout=timeout) as http:
        tasks = [asyncio.create_task(one(i, http)) for i in range(n)]
        await done.wait()
        for _ in range(int(BUSY_WAIT_S / 0.001)):
            if busy():
                break
            await asyncio.sleep(0.001)
        await lab.strike(kind)
        await asyncio.gather(*tasks)
    return verdicts


def _total(metrics: str, family: str) -> int:
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines() if ln.startswith(family + "{")))


async def run_kind(
    lab: FaultLab, kind: str, n: int, concurrency: int = 8, overrides: dict[str, Any] | None = None
) -> Tally:
    """One fault kind on a fresh gateway: its tally."""
    await lab.prepare()
    async with gateway(lab, kind, overrides or {}) as (url, app):
        for fault in ARMED.get(kind, []):
            await lab.arm(({"count": n} if fault["action"] != "slow" else {}) | fault)
        victim = app[GATEWAY].fleet.get(lab.victim.urls[0])
        busy = (lambda: victim.inflight_requests > 0) if victim is not None else (lambda: True)
        answers = await burst(lab, kind, url, n, concurrency, busy)
        metrics = app[GATEWAY].metrics.render().decode()
    verdicts = [v for v, _ in answers]
    t = Tally(kind, requests=len(verdicts), slowest_s=max((s for _, s in answers), default=0.0))
    t.completed, t.failed_early = verdicts.count("completed"), verdicts.count("failed_early")
    t.stream_errors, t.lost = verdicts.count("stream_error"), verdicts.count("lost")
    t.retries = _total(metrics, "kvroute_retries_total")
    t.upstream_errors = _total(metrics, "kvroute_upstream_errors_total")
    t.trips = _total(metrics, "kvroute_replica_breaker_trips_total")
    return t
