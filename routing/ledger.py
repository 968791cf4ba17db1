"""What routing has promised but not yet seen happen: provisional blocks and open tickets.

**Provisional blocks.** When a request is routed, the cache model inserts its blocks on the chosen
replica at once (the next request with the same prefix must see them), but they only exist on the engine
once the request has run. ``Provisional`` keeps, per replica, a multiset of the blocks that requests
still in flight *hold*: a request holds every block from the first one of its chain that was itself
provisional when it was routed (it will compute those if their first holder never runs) to its end.

- the request ran (its first byte came back): ``confirm`` removes its blocks from the multiset entirely:
  they are real now, whoever else held them;
- it never ran (it failed before its first byte, or it was retried elsewhere): ``release`` takes one
  count off each of its blocks and returns those that no request holds any more and that nothing
  confirmed: exactly the blocks to remove from the replica's tiers. A block that another in-flight
  request also holds stays, because that request will compute it.

This keeps rollbacks from removing the ancestors of blocks that stay, so the tiers stay prefix-closed
(``routing.tiers``).

**Open tickets.** ``OpenTickets`` bounds the tickets handed out and not yet finished (a caller that loses
one must not leak memory): beyond ``limit`` the oldest is returned to be settled as if it ran.

A ``Ticket`` (one routed request, from ``Router.route`` to ``Router.finish``) carries everything its
outcome needs: the routing request, the decision, a typed ``Prediction`` (the match and the TTFT terms on
the replica that will serve it), the candidates it was routed on (for a retry) and the cache model's
receipt. A ``Preview`` is a decision not taken (``Router.preview``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, islice, repeat
from typing import Generic, TypeVar

from routing.types import (
    BlockHash,
    Candidate,
    Decision,
    Prediction,
    PrefixMatch,
    ReplicaId,
    RoutingRequest,
    TtftTerms,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Recorded:
    """The receipt of one ``record``: what was predicted and what the request holds provisionally."""

    request: RoutingRequest
    replica: ReplicaId
    match: PrefixMatch  # predicted tokens per tier on this replica
    confirmed: float  # predicted tokens on blocks that were real (not provisional) when routed
    held_from: int  # first block index the request holds provisionally
    new_end: bool  # hybrid: this request added its prompt's end to the replica's SequenceEnds


class CountedBlocks:
    """A multiset of block hashes, updated in bulk."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[BlockHash, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, block: object) -> bool:
        return block in self._counts

    def first_of(self, blocks: Sequence[BlockHash]) -> int:
        """Index of the first of ``blocks`` in the multiset, ``len(blocks)`` when none is."""
        if not self._counts:
            return len(blocks)
        flags = list(map(self._counts.__contains__, blocks))
        return flags.index(True) if True in flags else len(blocks)

    def add(self, blocks: Sequence[BlockHash]) -> None:
        counts = self._counts
        again = [(b, counts[b] + 1) for b in filter(counts.__contains__, blocks)]
        counts.update(dict.fromkeys(blocks, 1))
        counts.update(again)

    def clear(self) -> None:
        self._counts.clear()

    def pop_all(self, blocks: Sequence[BlockHash]) -> None:
        """Removes ``blocks`` whatever their counts."""
        list(map(self._counts.pop, blocks, repeat(0)))

    def remove(self, blocks: Sequence[BlockHash]) -> list[BlockHash]:
        """Takes one count off each of ``blocks``; returns those whose count reached zero."""
        counts = self._counts
        old = list(map(counts.pop, blocks, repeat(0)))
        counts.update((b, c - 1) for b, c in compress(zip(blocks, old, strict=True), map((1).__lt__, old)))
        return list(compress(blocks, map((1).__eq__, old)))


class Provisional:
    """Per replica, the blocks in-flight requests hold (see the module docstring)."""

    def __init__(self) -> None:
        self._held: dict[ReplicaId, CountedBlocks] = {}

    def first_held(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> int:
        held = self._held.get(replica)
        return held.first_of(blocks) if held is not None else len(blocks)

    def held(self, replica: ReplicaId) -> CountedBlocks:
        """The replica's held blocks, one live multiset for as long as the replica is known."""
        return self._held.setdefault(replica, CountedBlocks())

    def hold(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> None:
        if blocks:
            self.held(replica).add(blocks)

    def confirm(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> None:
        held = self._held.get(replica)
        if held is not None:
            held.pop_all(blocks)

    def release(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> list[BlockHash]:
        held = self._held.get(replica)
        return held.remove(blocks) if held is not None else []

    def drop(self, replica: ReplicaId) -> None:
        held = self._held.get(replica)
        if held is not None:
            held.clear()

    def forget(self, replica: ReplicaId) -> None:
        self._held.pop(replica, None)

    def holds(self, replica: ReplicaId, block: BlockHash) -> bool:
        held = self._held.get(replica)
        return held is not None and block in held

    def blocks(self, replica: ReplicaId) -> int:
        held = self._held.get(replica)
        return len(held) if held is not None else 0


class OpenTickets(Generic[T]):
    """Items by serial number, at most ``limit`` of them, oldest first out."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._open: dict[int, T] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, serial: int) -> bool:
        return serial in self._open

    def add(self, serial: int, item: T) -> list[T]:
        """Opens ``item``; returns the oldest items pushed out by the limit."""
        self._open[serial] = item
        excess = len(self._open) - self._limit
        if excess <= 0:
            return []
        old = list(islice(self._open, excess))
        return [self._open.pop(s) for s in old]

    def close(self, serial: int) -> T | None:
        return self._open.pop(serial, None)


@dataclass(frozen=True, slots=True)
class Preview:
    """A decision not taken: where ``route`` would send a request, what it expects to find there (the
    cache model's match and the TTFT terms) and the request's estimated prompt tokens."""

    decision: Decision
    match: PrefixMatch
    terms: TtftTerms | None
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Ticket:
    """One routed request on one replica, from ``route`` (or ``retarget``) to ``finish``."""

    serial: int
    request: RoutingRequest
    decision: Decision
    prediction: Prediction
    candidates: tuple[Candidate, ...]  # the snapshot it was routed on, for retargeting
    canonical_bytes: int = 0  # size of the rendered text prompt, 0 when there is nothing to learn from
    recorded: Recorded | None = None
    prompted: bool = True  # it had a prompt (a generation request), not a pass-through body

    @property
    def replica(self) -> ReplicaId:
        return self.decision.replica
