"""SGLang's KV-event publisher for one emulated replica (``--kv-events-config``, sglang-contract.md §6).

``KvEventsConfig`` is SGLang's ``KVEventsConfig`` (JSON; the same fields and defaults; ``publisher``
``"zmq"`` publishes, ``null`` does not). ``KvEventPublisher`` owns the sockets:

- a ZMQ **PUB** socket on ``endpoint``: it *binds* when the endpoint holds ``*`` or ``::`` or is ``ipc://``
  / ``inproc://``, else it *connects* (so a subscriber may bind, as SGLang allows). Each batch is the
  multipart message ``[topic, seq as 8-byte big-endian, msgpack([ts, events, dp_rank])]``; ``seq``
  starts at 0 and grows by one per batch; ``dp_rank`` is 0 (each emulated replica is its own server);
- the optional **ROUTER** ``replay_endpoint`` (always bound): a request frame holding a start seq
  (8-byte big-endian) is answered with one ``[seq, payload]`` message per buffered batch with seq >=
  start, then ``[-1 as 8 bytes, b""]``, each after the requester's envelope (its identity and, if it
  sent one, the empty delimiter frame). The last ``buffer_steps`` batches are kept.

With ``--replicas N`` (or ``--ports``) replica ``i`` (0-based, in port order) uses the endpoints'
TCP port + ``i*S`` (``ipc://`` / ``inproc://`` get the suffix ``_dp<i>``), like SGLang's DP-rank offset
when S is 1; S grows only when that would give one replica's publisher port to another's replay endpoint
(emulator/port_plan.py has the layout and the clash check).

Flush timing (as SGLang's scheduler, with an emulated decode cadence): the recorder's queue is
published after every prefill batch, every ``interval_s`` while anything is queued (the emulator's
stand-in for "every 40 decode steps and the idle self-check": 40 single-sequence decode steps of the
profile, times the time scale, so expect that much lag for events of finishing requests and of
evictions outside a prefill), and at once after a flush or restart (``AllBlocksCleared``). The
``hwm`` is the PUB send high-water mark; ``max_queue_size`` is accepted and ignored (no publisher
thread here). The emulator's "restart" fault keeps the sockets, the sequence and the replay buffer
(a real restart is a new process whose publisher starts again at seq 0): subscribers see it as an
``AllBlocksCleared`` batch. ``/server_info`` reports this replica's config as ``kv_events_config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import msgpack
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10000
    hwm: int = 100000
    max_queue_size: int = 100000
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KvEventsConfig:
        """The flag's JSON; ValueError names what is wrong."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in doc.items() if k in known})
        if cfg.publisher not in (None, "null", "zmq"):
            raise ValueError(f"--kv-events-config: unknown publisher {cfg.publisher!r} (null or zmq)")
        counts = (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size)
        if not all(isinstance(n, int) and n >= 0 for n in counts):
            raise ValueError("--kv-events-config: buffer_steps, hwm and max_queue_size are integers >= 0")
        texts = (cfg.endpoint, cfg.topic, cfg.replay_endpoint or "")
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("--kv-events-config: endpoint, replay_endpoint and topic are strings")
        return cfg

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    def for_replica(self, index: int, stride: int = 1) -> KvEventsConfig:
        """The endpoints of the replica with this 0-based index (TCP ports + index * stride)."""
        replay = self.replay_endpoint
        replay = None if replay is None else offset_endpoint(replay, index, stride)
        return replace(self, endpoint=offset_endpoint(self.endpoint, index, stride), replay_endpoint=replay)


def offset_endpoint(endpoint: str, index: int, stride: int = 1) -> str:
    """``tcp://host:port`` -> port + index * stride; ``ipc://`` / ``inproc://`` -> suffix ``_dp<index>``."""
    if index == 0:
        return endpoint
    m = re.fullmatch(r"(tcp://.*:)(\d+)", endpoint)
    if m:
        return f"{m.group(1)}{int(m.group(2)) + index * stride}"
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{index}"
    return endpoint


def binds(endpoint: str) -> bool:
    """SGLang's rule: bind for a wildcard address or a local transport, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventPublisher:
    """Publishes what ``take()`` returns (a list of wire-shaped events) in numbered batches."""

    def __init__(self, cfg: KvEventsConfig, take: Callable[[], list[Any]], interval_s: float) -> None:
        self.cfg = cfg
        self.take = take
        self.interval_s = max(0.001, interval_s)
        self.topic = cfg.topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Open the sockets and start the periodic flush and the replay service (OSError if busy)."""
        self._ctx = zmq.asyncio.Context()
        try:
            self._pub = self._socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, self.cfg.hwm)
            (self._pub.bind if binds(self.cfg.endpoint) else self._pub.connect)(self.cfg.endpoint)
            if self.cfg.replay_endpoint is not None:
                self._replay = self._socket(zmq.ROUTER)
                self._replay.bind(self.cfg.replay_endpoint)
                self._tasks.append(asyncio.create_task(self._serve_replay()))
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise OSError(f"--kv-events-config: {exc} ({self.cfg.endpoint})") from exc
        self._tasks.append(asyncio.create_task(self._tick()))

    def flush(self) -> None:
        """Publish the queued events as one batch (nothing when none are queued)."""
        events = self.take()
        if not events or self._pub is None:
            return
        payload = msgpack.packb([time.time(), events, 0])
        seq, self.seq = self.seq, self.seq + 1
        if self.buffer.maxlen:
            self.buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._close_sockets()

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.flush()

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) < 2 or len(frames[-1]) != 8:
                continue  # not a replay request: ignored, as SGLang does
            envelope, start = frames[:-1], int.from_bytes(frames[-1], "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await sock.send_multipart([*envelope, seq.to_bytes(8, "big"), payload])
            await sock.send_multipart([*envelope, END_SEQ, b""])
