"""One replica's KV-event feed: a pyzmq asyncio SUB, sequence tracking, replay of gaps, into the Router.

``KvFeed.run`` reads ``[topic, seq, payload]`` messages (``proxy/sync/kv_wire.py``) from the replica's PUB
endpoint, subscribed to the config's ``topic`` (the SUB connects to a PUB that binds, and binds the
address a connecting PUB names: ``proxy.sync.kv_link.publisher_binds``). ``SeqTracker`` classifies each
batch's seq against the last one applied:

- ``next`` (last + 1), or ``first`` (nothing applied yet): applied;
- ``gap`` (beyond last + 1; a first seq > 0 is a gap from 0, a SUB that joined late): the missing
  batches are asked from the replay endpoint (DEALER -> ROUTER, ``replay_request(last + 1)``; replies
  until the end marker, within ``REPLAY_TIMEOUT_S``) and applied in order; if some cannot be had (no
  replay endpoint, a trimmed buffer, a time-out) the Router is told ``kv_reset(replica, "gap")``
  (a late join without a replay endpoint is not a reset: nothing was known before);
- ``restart`` (seq <= last: a new publisher counts from 0 again): the restart owner is told
  (``proxy/fleet/restarts.py``: the model resets once, here), the new publisher's earlier batches are
  replayed from 0, then it is applied;
- ``duplicate`` (seq <= the last batch a catch-up replay applied): already applied, skipped.

**Catch-up**: when the feed starts (a gateway that starts or restarts, a replica that joins) it asks the
replay endpoint for every buffered batch from 0 before it reads live ones, so its view equals the
replica's at once instead of when the replica next publishes; live batches that the replay already
covered are then duplicates. The buffer holds the last ``buffer_steps`` batches (SGLang: 10000): a
replica that published more has its history from ``stats.history_from`` only. ``new_epoch`` (the
restart owner, when the replica's start time changed before the feed saw a new sequence) makes the next
batch the first of a new publisher: the tracker forgets its last seq, and the new publisher's buffer is
replayed from 0 at once and read again ``LOOK_AGAIN_S`` later, as it is after any reconnect: batches
sent while the SUB was away, or before its subscription reached the publisher (ZMQ's slow joiner), are
never seen live, and an idle replica sends no later batch that would show the gap.

Batches go to ``Router.apply_kv_events`` on the event loop (the Router is synchronous): its cost is
measured (``apply_s``). A large message is decoded in a thread first (``decode_off_loop``). Undecodable
messages are counted (``decode_errors``) and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from proxy.sync.kv_link import Link, follow
from proxy.sync.kv_wire import WireError, decode_message, decode_replay, replay_request
from routing.kv_events import EventBatch
from routing.types import ReplicaId

log = logging.getLogger("kvroute.kv_events")
REPLAY_TIMEOUT_S = 2.0
LOOK_AGAIN_S = 1.0  # after a reconnect or a new epoch, the buffer is read once more this much later
THREAD_BYTES = 64 << 10  # a message this large is decoded in a thread (a 40K-token store: ~370 KB, ~18 ms)


@dataclass(slots=True)
class FeedStats:
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replayed_batches: int = 0
    resets: int = 0
    decode_errors: int = 0
    last_seq: int = -1
    history_from: int = 0  # the first seq a catch-up replay found (> 0: earlier batches were trimmed)
    duplicates: int = 0
    live_batches: int = 0  # received on the SUB (the others came from a replay)
    last_live_at: float = 0.0  # wall time the last live batch was received (0: none yet)
    lag_s: float = 0.0  # receive time - publish time of the last live batch
    apply_s: float = 0.0  # seconds spent in Router.apply_kv_events, in total


class SeqTracker:
    """The last applied seq, and what a new one means (see the module docstring)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.replayed_to: int | None = None  # the last seq a catch-up replay applied (until passed)

    def classify(self, seq: int) -> str:
        if self.replayed_to is not None:
            if seq <= self.replayed_to:
                return "duplicate"
            self.replayed_to = None
        if self.last is None:
            return "first" if seq == 0 else "gap"
        if seq == self.last + 1:
            return "next"
        return "gap" if seq > self.last else "restart"

    def missing_from(self) -> int:
        return 0 if self.last is None else self.last + 1


Apply = Callable[[EventBatch], None]
Reset = Callable[[str], None]


def _nothing() -> None:
    pass


class KvFeed:
    """The subscription of one replica (see the module docstring)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        replica: ReplicaId,
        endpoint: str,
        bind: bool,
        replay_endpoint: str | None,
        topic: str,
        apply: Apply,
        reset: Reset,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.replica = replica
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.stats = FeedStats()
        self.seq = SeqTracker()
        self._ctx = ctx
        self._apply = apply
        self._reset = reset
        self._epoch = False
        self._replays: set[asyncio.Task[None]] = set()
        self._on_reconnect = on_reconnect or _nothing
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.link = Link(self._sub, self._reconnected)  # the connection (proxy/sync/kv_link.py)
        try:
            (self._sub.bind if bind else self._sub.connect)(endpoint)
        except zmq.ZMQError:
            self.close()
            raise

    def new_epoch(self) -> None:
        """The replica is a new process: its next batch starts a new sequence (module docstring), and
        its batches are replayed from 0 now and once more ``LOOK_AGAIN_S`` later: those it sends before
        this SUB is subscribed again are lost to it (ZMQ's slow joiner), and an idle replica may send no
        other."""
        self._epoch = True
        self._in_background(self._replay_epoch())

    def _reconnected(self) -> None:
        """The publisher is back (the same process after a network cut, or a new one): what it sent
        while the SUB was away is read from its buffer ``LOOK_AGAIN_S`` later."""
        self._on_reconnect()
        self._in_background(self._look_again())

    def _in_background(self, replay: Coroutine[Any, Any, None]) -> None:
        if not self.replay_endpoint:
            replay.close()
            return
        task = asyncio.get_running_loop().create_task(replay)
        self._replays.add(task)
        task.add_done_callback(self._replays.discard)

    async def _replay_epoch(self) -> None:
        if self._epoch:  # else a live batch came first and began the new sequence
            self._epoch, self.seq.last, self.seq.replayed_to = False, None, None
            await self.catch_up()
        await self._look_again()

    async def _look_again(self) -> None:
        await asyncio.sleep(LOOK_AGAIN_S)
        await self.catch_up()

    async def run(self) -> None:
        """Follows the connection; catches up from the replay endpoint, then reads and applies batches
        until cancelled."""
        monitor = asyncio.get_running_loop().create_task(follow(self.link))
        try:
            await self._read()
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)

    async def _read(self) -> None:
        if self.replay_endpoint:
            await self.catch_up()
        while True:
            frames = await self._sub.recv_multipart()
            try:
                batch = await decode_off_loop(frames)
            except WireError as exc:
                self.stats.decode_errors += 1
                log.warning("KV event from %s not decoded: %s", self.replica, exc)
                continue
            if batch.topic != self.topic:  # a longer topic that merely starts with ours
                continue
            await self.accept(batch, time.time())

    async def accept(self, batch: EventBatch, now: float) -> None:
        """One live batch: gap or restart handling first, then applied (a duplicate is skipped)."""
        self.stats.lag_s = max(0.0, now - batch.ts)
        self.stats.live_batches += 1
        self.stats.last_live_at = now
        if self._epoch:
            self._epoch, self.seq.last, self.seq.replayed_to = False, None, None
        kind = self.seq.classify(batch.seq)
        if kind == "duplicate":
            self.stats.duplicates += 1
            return
        if kind == "restart":
            self._reset_model("restart")
            self.seq.last = None
            kind = self.seq.classify(batch.seq)
        if kind == "gap":
            await self._fill(batch.seq)
        self._apply_one(batch)

    async def catch_up(self) -> None:
        """Every buffered batch from the next one this feed lacks (0 at the start), applied in order."""
        start = self.seq.missing_from()
        got = sorted(await self._replay(start, None), key=lambda b: b.seq)
        if not got:
            return
        if got[0].seq != start:
            self.stats.history_from = got[0].seq
        for b in got:
            if self.seq.last is None or b.seq == self.seq.last + 1:
                self._apply_one(b)
        self.seq.replayed_to = self.seq.last

    def close(self) -> None:
        for task in self._replays:
            task.cancel()
        self.link.close()
        self._sub.close(linger=0)

    async def _fill(self, upto: int) -> None:
        """Replays the batches before ``upto``; a model reset when some cannot be had."""
        start, late_join = self.seq.missing_from(), self.seq.last is None
        if not late_join:
            self.stats.gaps += 1
        got = await self._replay(start, upto) if self.replay_endpoint else []
        if [b.seq for b in got] == list(range(start, upto)):
            for b in got:
                self._apply_one(b)
            return
        if not late_join or self.replay_endpoint:
            self._reset_model("gap")

    async def _replay(self, start: int, upto: int | None) -> list[EventBatch]:
        """Batches ``start .. upto - 1`` (``upto`` None: all that are buffered) from the replay endpoint
        (fewer on a time-out or a short buffer)."""
        assert self.replay_endpoint is not None
        self.stats.replays += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: list[EventBatch] = []
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", replay_request(start)])
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while (b := decode_replay(await sock.recv_multipart())) is not None:
                    if start <= b.seq and (upto is None or b.seq < upto):
                        got.append(b)
        except (TimeoutError, WireError, zmq.ZMQError) as exc:
            log.warning("KV event replay from %s failed: %s", self.replica, exc or "timed out")
        finally:
            sock.close(linger=0)
        self.stats.replayed_batches += len(got)
        return got

    def _apply_one(self, batch: EventBatch) -> None:
        t0 = time.perf_counter()
        self._apply(batch)
        self.stats.apply_s += time.perf_counter() - t0
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.stats.last_seq = batch.seq
        self.seq.last = batch.seq

    def _reset_model(self, reason: str) -> None:
        self.stats.resets += 1
        log.warning("KV events of %s: %s, the cache model resets", self.replica, reason)
        self._reset(reason)


async def decode_off_loop(frames: list[bytes]) -> EventBatch:
    """``decode_message``, in a thread for a message of ``THREAD_BYTES`` or more: the decoder holds the
    GIL, but the interpreter hands it back to the event loop every switch interval (5 ms), so a long
    prompt's store (thousands of pages in one batch) no longer stalls the loop for the whole decode.
    Batches stay in order: the feed awaits each decode before it reads the next message."""
    if sum(map(len, frames)) < THREAD_BYTES:
        return decode_message(frames)
    return await asyncio.to_thread(decode_message, frames)


async def stop(feed: KvFeed, task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    feed.close()
