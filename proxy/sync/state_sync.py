"""Several gateways, one view: the background task that shares routing state through a store.

Two loops. The **publisher** (1) publishes what this gateway's Router saw (``Router.drain``: requests
recorded on replicas, rollbacks, restarts) and its documents that are due (``proxy.sync.shared_docs``: its
load on every replica and its learned rates each round, its warm-up jobs each second) as soon as there is
something: the Router's outbox kicks it, and so does every change of a load lease (a request routed, its
first token, its end; ``Fleet.load_changed``) while there are other gateways; rounds are at least
``MIN_GAP_S`` = 2 ms apart, so a burst goes out as one batch, and at most ``interval_s`` (50 ms) apart.
The **reader** (2) waits on the log (a blocking read of up to ``interval_s``: Redis ``XREAD BLOCK`` on the
log and on the pulse stream, which every round without events touches), applies what the others published
as soon as it is there (``Router.apply``), then reads the others' documents and adopts them (their loads
add to this gateway's in every snapshot, ``proxy.fleet.load.combined``; their rates pool with its own). A
gateway publishes its load in the same round trip as its events, so the load a request added is known with
the request. Reading rounds are also ``MIN_GAP_S`` apart. Requests never wait for either loop: routing
always runs on the local view. The staleness bound, while the store answers: another gateway's routed
requests, the load they add and its rates within ~2 ms + 3 RTT (its publish, this read, this gather), and
so are its other load changes (first tokens, finished requests: a round with only documents carries a
pulse that wakes the readers, when there are readers to wake); warm-ups within 1 s + RTT.

History: a 50 ms polling round for everything, the first design, let gateways routing new documents
within one round disagree (three gateways behind round robin sent 21% of rag's requests where one
gateway would). Asked at the same moment where they would route each request (``bench.gateways``'
route previews), three gateways that published rates every second and adopted the others' loads only
in their own rounds named different replicas for 13-18% of the requests (quick runs), mostly from
rates learned apart; with rates every round, documents adopted after each read and pulses, 1.2% and
2.0% (agent and rag at full size).

- **Start**: before the gateway reports ready (``/ready``), the task replays the whole log (the last
  ``LOG_MAX`` batches), so a gateway that starts or restarts routes its first repeats to their holders.
  A store that does not answer within ``START_WAIT_S`` does not keep the gateway unready: it starts on
  its own view, degraded.
- **Trouble** (the store down, slow, restarted, flushed, failing over): a round that fails keeps what it
  had to publish for the next one (bounded), routing goes on with the local view and zero failed
  requests, and the change is said once (a WARNING, ``kvroute_state_sync_up`` 0, ``/status``). While it
  lasts both loops back off (full jitter, ``proxy.upstream.retry_budget.backoff_s``: from ``RETRY_S``
  doubling to ``RETRY_MAX_S``),
  so an outage costs a few attempts a second, not one per load change; when the store answers again
  the task says so, clears ``last_error`` and reads on from its last position (a flushed store simply
  has nothing older: new entries follow).
- **Said at start**: the store reached (or not), and how many events of how many other gateways the
  start-up replay applied.
- **Stop**: the gateway leaves the store (its heartbeat and documents are deleted), so the others stop
  counting it as a peer and its load at once rather than when those expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.context import GATEWAY, Gateway
from proxy.sync.redis_store import store_from_url
from proxy.sync.shared_docs import CalibrationPart, LoadPart, Part, RatesPart, Schedule
from proxy.sync.state_store import Doc, StateStore
from proxy.upstream.retry_budget import backoff_s
from routing.sharing import MAX_BUFFERED, Event

log = logging.getLogger("kvroute.state")
START_WAIT_S = 5.0
MIN_GAP_S = 0.002  # between two publishing rounds
STOP_WAIT_S = 2.0
RETRY_S, RETRY_MAX_S = 0.1, 5.0  # the backoff between rounds while the store does not answer


@dataclass
class SyncStats:
    state: str = "starting"  # starting, synced, degraded
    published_events: int = 0
    applied_events: int = 0
    rounds: int = 0
    failures: int = 0
    peers: int = 0
    last_error: str | None = None
    last_ok_s: float = 0.0
    position: str = "0"


@dataclass
class StateSync:
    gw: Gateway
    store: StateStore
    interval_s: float = 0.05
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    stats: SyncStats = field(default_factory=SyncStats)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    parts: list[Part] = field(default_factory=list)
    _pending: list[Event] = field(default_factory=list)
    _kick: asyncio.Event = field(default_factory=asyncio.Event)
    _schedule: Schedule = field(default_factory=Schedule)
    _failed_rounds: dict[str, int] = field(default_factory=lambda: {"publish": 0, "read": 0})

    def __post_init__(self) -> None:
        router = self.gw.router
        self.parts += [
            LoadPart(self.gw.fleet, self.gw.liveness),
            RatesPart(router.rates),
            CalibrationPart(router),
        ]

    def kick(self) -> None:
        """The Router has a new event to share: publish without waiting for the next round."""
        self._kick.set()

    def load_kick(self) -> None:
        """A load lease changed: publish now when other gateways are there to see it."""
        if self.stats.peers:
            self._kick.set()

    async def run(self) -> None:
        """Runs until cancelled: the start-up replay, then the publisher and the reader."""
        try:
            await asyncio.wait_for(self._start(), timeout=START_WAIT_S)
            log.info(
                "state store %s reached: %d events of %d other gateways replayed at start",
                self.store.name, self.stats.applied_events, self.stats.peers,
            )  # fmt: skip
        except Exception as e:
            self._trouble(e)
        self.ready.set()
        async with asyncio.TaskGroup() as loops:  # a cancel ends run once both loops have ended
            loops.create_task(self._publishing())
            loops.create_task(self._reading())

    async def _publishing(self) -> None:
        """A round as soon as the Router has something to share (at most every ``MIN_GAP_S``, so a
        burst goes out as one batch), else every ``interval_s`` (the due documents)."""
        while True:
            _stop_if_asked()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)
            self._kick.clear()
            try:
                await self._publish()
                self._failed_rounds["publish"] = 0
            except Exception as e:
                self._trouble(e)
                await asyncio.sleep(self._backoff("publish"))
            await asyncio.sleep(MIN_GAP_S)

    async def _reading(self) -> None:
        """Applies the others' events as soon as they are in the log (a blocking read of up to
        ``interval_s``), then adopts their documents (as of those events)."""
        adopted = 0.0
        while True:
            _stop_if_asked()
            try:
                others = await self._apply_log(self.interval_s)
                now = time.monotonic()
                if others or now - adopted >= self.interval_s:  # not for this gateway's own batches
                    await self._adopt(self.parts)
                    adopted = now
                self._ok()
                self._failed_rounds["read"] = 0
            except Exception as e:
                self._trouble(e)
                await asyncio.sleep(max(self.interval_s, self._backoff("read")))
            await asyncio.sleep(MIN_GAP_S)

    async def _start(self) -> None:
        """The replay, once every replica's capacities are known (the cache model sizes its tiers from
        them: replayed into a replica of unknown size, the blocks would not be kept), or after half of
        ``START_WAIT_S`` (a replica that is down does not hold up what is known of the others)."""
        for _ in range(int(START_WAIT_S / 2 / 0.02)):
            if all(r.info is not None for r in self.gw.fleet.replicas()):
                break
            await asyncio.sleep(0.02)
        await self._publish()
        await self._apply_log(0.0)
        await self._adopt(self.parts)

    async def _publish(self) -> None:
        self._pending.extend(self.gw.router.drain())
        del self._pending[: max(0, len(self._pending) - MAX_BUFFERED)]
        due = self._schedule.due(self.parts, time.monotonic())
        docs = {p.kind: Doc(orjson.dumps(p.export()), p.ttl_s) for p in due}
        await self.store.publish(self.gateway_id, self._pending, docs, pulse=self.stats.peers > 0)
        self.stats.published_events += len(self._pending)
        self._pending = []
        self._ok()

    def _ok(self) -> None:
        self.stats.rounds += 1
        self.stats.last_ok_s = time.monotonic()
        if self.stats.state != "synced":
            if self.stats.state == "degraded":
                log.warning("state store %s answers again: shared state resumes", self.store.name)
            self.stats.state, self.stats.last_error = "synced", None

    async def _apply_log(self, block_s: float) -> bool:
        """Applies the others' batches; whether anything of theirs came (their batches, or a read that
        ended with none: another gateway's pulse, or the wait ran out)."""
        fleet, router = self.gw.fleet, self.gw.router
        others, first = False, True
        while True:
            batches, position = await self.store.read(self.stats.position, block_s)
            others = (
                others or (first and not batches) or any(b.gateway != self.gateway_id for _, b in batches)
            )
            block_s, first = 0.0, False
            self.stats.position = position
            remote = [e for pos, b in batches if b.gateway != self.gateway_id for e in b.events]
            if remote:
                router.cache.sync(fleet.snapshot(None))
                self.stats.applied_events += router.apply(remote)
            if not batches:
                return others

    async def _adopt(self, parts: list[Part]) -> None:
        found = await self.store.gather([p.kind for p in parts], self.gateway_id)
        self.stats.peers = len(found.get("load", {})) if "load" in found else self.stats.peers
        for p in parts:
            try:
                p.adopt(found.get(p.kind, {}))
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
                log.warning("a %s document from another gateway is malformed (%s): ignored", p.kind, e)

    def _backoff(self, loop: str) -> float:
        """The wait before that loop's next round, after one more failed in a row."""
        self._failed_rounds[loop] += 1
        return backoff_s(min(self._failed_rounds[loop], 20), RETRY_S, RETRY_MAX_S)

    def _trouble(self, e: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{type(e).__name__}: {e}"[:300]
        if self.stats.state != "degraded":
            log.warning(
                "state store %s unavailable (%s): routing on this gateway's own view until it answers",
                self.store.name,
                self.stats.last_error,
            )
            self.stats.state = "degraded"

    def status(self) -> dict[str, Any]:
        s = self.stats
        age = time.monotonic() - s.last_ok_s if s.last_ok_s else None
        return {
            "store": self.store.name,
            "gateway": self.gateway_id,
            "state": s.state,
            "peers": s.peers,
            "published_events": s.published_events,
            "applied_events": s.applied_events,
            "failures": s.failures,
            "last_error": s.last_error,
            "seconds_since_last_sync": age,
        }


class SyncCollector(Collector):
    """kvroute_state_sync_up, kvroute_state_peers, kvroute_state_events_total{direction}."""

    def __init__(self, sync: StateSync) -> None:
        self._sync = sync

    def collect(self) -> Iterator[Metric]:
        s = self._sync.stats
        up = GaugeMetricFamily("kvroute_state_sync_up", "1 while the state store answers, else 0")
        up.add_metric([], 1.0 if s.state == "synced" else 0.0)
        peers = GaugeMetricFamily("kvroute_state_peers", "Other gateways sharing state")
        peers.add_metric([], s.peers)
        events = CounterMetricFamily("kvroute_state_events", "Shared routing events", labels=["direction"])
        events.add_metric(["published"], s.published_events)
        events.add_metric(["applied"], s.applied_events)
        yield from (up, peers, events)


STATE_SYNC: web.AppKey[StateSync] = web.AppKey("state_sync", StateSync)


def _stop_if_asked() -> None:
    """Ends the running task if it was asked to stop. A cancel that meets a store client's own read
    time-out can come back as a ``TimeoutError`` (redis-py's read under ``async_timeout`` on Python
    3.11), which the loops take for a store in trouble and retry: the task then outlived its gateway,
    and the event loop's close waited on it for ever (seen in about 1 test run in 10)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _sync_ctx(app: web.Application) -> AsyncIterator[None]:
    sync = app[STATE_SYNC]
    task = asyncio.get_running_loop().create_task(sync.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(Exception):  # a store that hangs does not hold the shutdown
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), STOP_WAIT_S)
            kinds = [p.kind for p in sync.parts]
            await asyncio.wait_for(sync.store.leave(sync.gateway_id, kinds), STOP_WAIT_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sync.store.close(), STOP_WAIT_S)


def add_to(app: web.Application) -> None:
    """With ``--state``: the Router shares its events and the sync task runs as long as the app (after
    the health poller's first round, so replicas are known before the replay)."""
    gw = app[GATEWAY]
    if gw.settings.state is None:
        return
    sync = StateSync(gw, store_from_url(gw.settings.state, gw.settings.state_namespace))
    gw.router.share(sync.kick)
    gw.fleet.load_changed = sync.load_kick
    gw.metrics.add(SyncCollector(sync))
    gw.metrics.register_section("state", sync.status)
    app[STATE_SYNC] = sync
    app.cleanup_ctx.append(_sync_ctx)
