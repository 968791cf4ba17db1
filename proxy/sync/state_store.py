"""Where gateways meet: the state-store seam and its two implementations.

A ``StateStore`` carries, between gateways, (1) batches of ``routing.sharing`` events, an append-only
log every gateway reads from its last position, and (2) per gateway a few *documents*, each overwritten
by its gateway and expiring unless renewed: ``load`` (its load on every replica), ``rates`` (the rates it
learned) and ``warmups`` (its warm-up jobs). It never sees prompt text: events carry block hashes and
counts, session keys are hashes, replica ids are URLs, warm-up jobs are ids, counts and states.

- ``MemoryStore``: in-process. One gateway alone needs nothing else (the embedded default: nothing to
  set up); several gateway apps in one process can share one, which is how the sharing logic is tested
  without a network.
- ``RedisStore`` (``--state redis://HOST:PORT/DB``, also ``rediss://``, ``redis+cluster://HOST:PORT`` and
  ``redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE[/DB]``, through redis-py's asyncio client): the log is
  a stream ``kvroute:{NS}:events`` (``XADD ... MAXLEN ~ LOG_MAX``, entries ``{g: gateway, p: payload}``),
  each document a string ``kvroute:{NS}:doc:{KIND}:{GATEWAY}`` (``SET ... PX``: its ttl), the gateways
  listed in the sorted set ``kvroute:{NS}:gateways`` (score: last publish time), and a short stream
  ``kvroute:{NS}:pulse`` (``MAXLEN ~ 256``, entries ``{g: gateway}``) gets one entry per publishing round:
  a read blocks on it beside the log, so a round that changed only documents wakes the others. Every
  key expires (the log, the pulses and the set after ``LOG_TTL_S`` of silence, documents after their
  ttl); the ``{NS}`` hash tag keeps them in one cluster slot.

Payloads are JSON; block hashes are packed little-endian uint64 in base64.
"""

from __future__ import annotations

import asyncio
import base64
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from routing.sharing import Discarded, Event, Restarted, Routed

LOG_MAX = 20_000  # batches kept in the log: what a gateway that starts replays
LOG_TTL_S = 24 * 3600
GATEWAY_TTL_S = 60.0  # a gateway silent this long is no longer listed


@dataclass(frozen=True, slots=True)
class Doc:
    """One per-gateway document to publish: its JSON and how long it stays without renewal."""

    data: bytes
    ttl_s: float


@dataclass(frozen=True, slots=True)
class Batch:
    gateway: str
    events: tuple[Event, ...]


class StateStore(Protocol):
    """What the sync task needs of a store; every call may raise (the task tolerates it)."""

    name: str

    async def publish(
        self, gateway: str, events: Sequence[Event], docs: Mapping[str, Doc], pulse: bool = True
    ) -> None:
        """Appends the events (if any), renews the documents; ``pulse``: wakes the others' reads even
        without events (their documents changed)."""
        ...

    async def read(self, since: str, block_s: float = 0.0) -> tuple[list[tuple[str, Batch]], str]:
        """Batches after position ``since`` ("0": from the start), and the new position; with ``block_s``
        > 0 it waits up to that long for the first one when there is none yet."""
        ...

    async def gather(self, kinds: Sequence[str], skip: str) -> dict[str, dict[str, Any]]:
        """Every other gateway's live documents of these kinds, decoded: kind -> gateway -> JSON."""
        ...

    async def leave(self, gateway: str, kinds: Sequence[str]) -> None:
        """The gateway stops: its documents of ``kinds`` and its heartbeat go, so the others stop
        counting its load and it as a peer at once rather than when they expire."""

    async def close(self) -> None: ...


def encode(batch: Batch) -> bytes:
    return orjson.dumps({"g": batch.gateway, "e": [_event(e) for e in batch.events]})


def _pack(hashes: Sequence[int]) -> str:
    return base64.b64encode(array("Q", hashes).tobytes()).decode()


def _unpack(text: str) -> tuple[int, ...]:
    packed = array("Q")
    packed.frombytes(base64.b64decode(text))
    return tuple(packed)


def _event(e: Event) -> list[Any]:
    if isinstance(e, Routed):
        return ["r", e.replica, _pack(e.block_hashes), e.block_tokens, e.prompt_tokens, e.session]
    if isinstance(e, Discarded):
        return ["d", e.replica, _pack(e.blocks)]
    return ["x", e.replica]


def decode(raw: bytes) -> Batch:
    return batch_of(orjson.loads(raw))


def batch_of(doc: Any) -> Batch:
    """A batch from its decoded JSON (``encode``'s)."""
    events: list[Event] = []
    for e in doc["e"]:
        if e[0] == "r":
            events.append(Routed(e[1], _unpack(e[2]), float(e[3]), int(e[4]), e[5]))
        elif e[0] == "d":
            events.append(Discarded(e[1], _unpack(e[2])))
        elif e[0] == "x":
            events.append(Restarted(e[1]))
    return Batch(str(doc["g"]), tuple(events))


def live_docs(
    docs: Mapping[tuple[str, str], tuple[float, bytes]],
    kinds: Sequence[str],
    skip: str,
    read: Callable[[bytes], Any],
) -> dict[str, dict[str, Any]]:
    """Per kind of ``kinds``, per gateway but ``skip``, its document (``read`` from its JSON) that has not
    expired; ``docs`` maps (kind, gateway) to (expiry on the monotonic clock, JSON)."""
    now = time.monotonic()
    out: dict[str, dict[str, Any]] = {k: {} for k in kinds}
    for (kind, g), (expires, data) in docs.items():
        if kind in out and g != skip and now < expires:
            out[kind][g] = read(data)
    return out


@dataclass
class MemoryStore:
    """An in-process store (see the module docstring)."""

    name: str = "memory"
    log: list[bytes] = field(default_factory=list)
    trimmed: int = 0  # batches dropped from the front (positions stay absolute)
    docs: dict[tuple[str, str], tuple[float, bytes]] = field(default_factory=dict)  # expiry, JSON

    async def publish(
        self, gateway: str, events: Sequence[Event], docs: Mapping[str, Doc], pulse: bool = True
    ) -> None:
        if events:
            self.log.append(encode(Batch(gateway, tuple(events))))
            excess = max(0, len(self.log) - LOG_MAX)
            del self.log[:excess]
            self.trimmed += excess
        now = time.monotonic()
        for kind, doc in docs.items():
            self.docs[(kind, gateway)] = (now + doc.ttl_s, doc.data)

    async def read(self, since: str, block_s: float = 0.0) -> tuple[list[tuple[str, Batch]], str]:
        if block_s > 0 and int(since) >= self.trimmed + len(self.log):
            await asyncio.sleep(block_s)  # in-process: polled (another gateway here publishes meanwhile)
        start = max(int(since), self.trimmed) - self.trimmed
        batches = [decode(raw) for raw in self.log[start:]]
        end = self.trimmed + len(self.log)
        return [(str(end), b) for b in batches], str(end)

    async def gather(self, kinds: Sequence[str], skip: str) -> dict[str, dict[str, Any]]:
        return live_docs(self.docs, kinds, skip, orjson.loads)

    async def leave(self, gateway: str, kinds: Sequence[str]) -> None:
        for kind in kinds:
            self.docs.pop((kind, gateway), None)

    async def close(self) -> None:
        return None
