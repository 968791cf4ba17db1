"""Consistent hashing on the session key (rendezvous / highest-random-weight), a baseline.

Key: the request's ``session_key`` (``x-session-id`` header or ``user``), else its first block hash
(requests that share their first block, e.g. a system prompt, land together), else none. Each healthy
replica r gets the weight ``xxh3_64(key ‖ 0x00 ‖ r)``; the highest weight wins. Adding or removing a
replica moves only the keys that it wins or held (1/n of them), with no ring to maintain and O(n) work
per request. Without a key the pick is a seeded draw. Reason: always CONSISTENT_HASH. It ignores load
and cache state entirely; that is the point of the baseline.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash

from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, NoCandidates, Outcome
from routing.types import Candidate, Decision, Reason, RoutingRequest


def routing_key(req: RoutingRequest) -> bytes | None:
    """The bytes the request is hashed on: session key, else first block hash, else None."""
    if req.session_key:
        return b"s:" + req.session_key.encode()
    if req.block_hashes:
        return b"b:" + req.block_hashes[0].to_bytes(8, "little")
    return None


def rendezvous_weight(key: bytes, replica: str) -> int:
    return int(xxhash.xxh3_64_intdigest(key + b"\x00" + replica.encode()))


class ConsistentHashPolicy:
    name = "consistent_hash"

    def __init__(self, cfg: RoutingConfig) -> None:
        self._rng = random.Random(cfg.seed)
        self._filter = HealthyFilter()

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision:
        cands = self._filter.filter(req, cands)
        if not cands:
            raise NoCandidates("no healthy replica")
        key = routing_key(req)
        if key is None:
            order = list(cands)
            self._rng.shuffle(order)
        else:
            order = sorted(cands, key=lambda c: rendezvous_weight(key, c.id), reverse=True)
        chosen = order[0]
        return Decision(
            replica=chosen.id,
            reason=Reason.CONSISTENT_HASH,
            predicted_cached_tokens=chosen.match.total_tokens,
            ranked=tuple(c.id for c in order),
        )

    def observe(self, outcome: Outcome) -> None:
        return None
