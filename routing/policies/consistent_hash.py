"""Consistent hashing on the session key (rendezvous / highest-random-weight), a baseline.

Key: the request's ``session_key`` (``x-session-id``), else its first block hash (requests that share
their first block, e.g. a system prompt, land together), else none. Each healthy replica r gets the
weight ``w(r) = xxh3_64(key ‖ 0x00 ‖ r)``; the highest weight wins: ``RendezvousScorer`` gives
cost(r) = -w(r) / 2^64 (range (-1, 0]). Adding or removing a replica moves only the keys that it wins or
held (1/n of them), with no ring to maintain and O(n) work per request. Without a key every cost is 0
and the pick is a seeded draw. Reason: always CONSISTENT_HASH. It ignores load and cache state
entirely; that is the point of the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, Pipeline, SeededPicker
from routing.protocols import Scored, Stage
from routing.types import Candidate, Reason, RoutingRequest


def routing_key(req: RoutingRequest) -> bytes | None:
    """The bytes the request is hashed on: session key, else first block hash, else None."""
    if req.session_key:
        return b"s:" + req.session_key.encode()
    if req.block_hashes:
        return b"b:" + req.block_hashes[0].to_bytes(8, "little")
    return None


def rendezvous_weight(key: bytes, replica: str) -> int:
    return int(xxhash.xxh3_64_intdigest(key + b"\x00" + replica.encode()))


class RendezvousScorer(Stage):
    """cost(r) = -rendezvous_weight(key, r) / 2^64, or 0 for every replica without a key."""

    name = "rendezvous"

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        key = routing_key(req)
        if key is None:
            return [Scored(c, 0.0) for c in cands]
        return [Scored(c, -rendezvous_weight(key, c.state.id) / 2.0**64) for c in cands]


def consistent_hash(cfg: RoutingConfig) -> Pipeline:
    picker = SeededPicker(cfg.seed, abs_tol=0.0)
    return Pipeline("consistent_hash", [HealthyFilter()], RendezvousScorer(), picker, Reason.CONSISTENT_HASH)
