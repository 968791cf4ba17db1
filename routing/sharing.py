"""What gateways tell each other through a shared state store, as events (``proxy/sync/state_sync.py``
carries them; nothing here does I/O).

Every gateway keeps its own cache model, sessions and pickers and routes on them alone: shared state is
never awaited on the request path. What one gateway learns about the replicas is published as events,
and the others apply them to their own model as if they had routed the request themselves:

- ``Routed``: a request was recorded on a replica (its block hashes and tokens per block, its prompt
  tokens, its session key, already a hash): the others insert the blocks into that replica's tiers (not
  provisionally: the publisher rolls back with ``Discarded`` if it never ran) and tell their policy's
  stages (sessions, the tie picker's recency, cache_aware's own tree);
- ``Discarded``: blocks a request that never ran held alone leave the replica's tiers;
- ``Restarted``: the replica lost its GPU and host tiers (a cache flush through one gateway, which the
  others cannot see from the replica's start time).

Events carry block hashes and counts only, never prompt text; session keys are hashed by the Router
before they reach any table.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from routing.cache_model import CacheModel
from routing.protocols import Lifecycle
from routing.types import BlockHash, ReplicaId, RoutingRequest


@dataclass(frozen=True, slots=True)
class Routed:
    replica: ReplicaId
    block_hashes: tuple[BlockHash, ...]
    block_tokens: float
    prompt_tokens: int
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Discarded:
    replica: ReplicaId
    blocks: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class Restarted:
    replica: ReplicaId


Event = Routed | Discarded | Restarted
MAX_BUFFERED = 100_000  # events kept for the publisher; beyond, the oldest are dropped (a stalled store)


class Outbox:
    """The events this gateway has to share, kept only once ``open`` (a state store is configured)."""

    def __init__(self) -> None:
        self._events: deque[Event] | None = None
        self._notify: Callable[[], None] | None = None

    def open(self, notify: Callable[[], None] | None = None) -> None:
        """Starts keeping events; ``notify`` (if given) is called after each one is put."""
        if self._events is None:
            self._events = deque(maxlen=MAX_BUFFERED)
        self._notify = notify

    def put(self, event: Event) -> None:
        if self._events is not None:
            self._events.append(event)
            if self._notify is not None:
                self._notify()

    @property
    def is_open(self) -> bool:
        return self._events is not None

    def drain(self) -> list[Event]:
        events = self._events
        if not events:
            return []
        out = list(events)
        events.clear()
        return out


def apply_events(cache: CacheModel, policy: Lifecycle, events: Sequence[Event]) -> int:
    """Other gateways' events applied to this one's cache model and policy; returns the events used
    (a ``Routed`` on a replica not known here yet is skipped)."""
    used = 0
    for e in events:
        if isinstance(e, Routed):
            rreq = RoutingRequest("", e.block_hashes, e.prompt_tokens, e.block_tokens, e.session)
            if not cache.insert_seen(rreq, e.replica):
                continue
            policy.chose(rreq, e.replica)
        elif isinstance(e, Discarded):
            cache.discard_seen(e.replica, e.blocks)
        else:
            cache.restart(e.replica)
            policy.restart(e.replica)
        used += 1
    return used
