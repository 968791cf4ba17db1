"""Session affinity that yields under overload.

A session (an explicit conversation key, ``RoutingRequest.session_key``) sticks to the replica that
served its last turn, because that replica holds its history. A *new* session avoids replicas that
already hold more than ``session_spread_factor`` x the fewest sessions any replica holds (+1): sessions
are long-lived and grow, so placing them by their first turn's cost alone would put every session
that shares a system prompt on the first replica that cached it. The cost policy keeps
the session there unless that replica's predicted TTFT exceeds the best candidate's by more than
``session_overload_factor`` (a replica that is down, draining or swamped gives the session up, and the
session then follows the new choice).

The table is bounded (``max_sessions``): a dict in recency order, least recently used sessions are
forgotten first, so memory is O(max_sessions) however many sessions pass through.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import islice

from routing.types import ReplicaId


class SessionTable:
    """session key -> the replica of its last turn, LRU-bounded."""

    def __init__(self, max_sessions: int) -> None:
        self._max = max(1, max_sessions)
        self._last: dict[str, ReplicaId] = {}
        self._held: Counter[ReplicaId] = Counter()  # sessions per replica

    def __len__(self) -> int:
        return len(self._last)

    def get(self, key: str | None) -> ReplicaId | None:
        return self._last.get(key) if key else None

    def remember(self, key: str | None, replica: ReplicaId) -> None:
        if not key:
            return
        last = self._last
        previous = last.pop(key, None)
        if previous is not None:
            self._held[previous] -= 1
        last[key] = replica
        self._held[replica] += 1
        if len(last) > self._max:
            for old in list(islice(last, len(last) - self._max + self._max // 64)):
                self._held[last.pop(old)] -= 1

    def held(self, replica: ReplicaId) -> int:
        """Sessions whose last turn went to ``replica``."""
        return self._held[replica]

    def crowded(self, replicas: Sequence[ReplicaId], factor: float) -> set[ReplicaId]:
        """Replicas holding more than ``factor`` x the least-loaded replica's sessions + 1: a new session
        should go elsewhere, or every session of a shared system prompt would pile onto its first holders
        (measured against the minimum, not the mean, so a replica that holds none is not left idle)."""
        if factor <= 0 or not replicas:
            return set()
        bound = factor * min(self._held[r] for r in replicas) + 1
        return {r for r in replicas if self._held[r] > bound}

    def forget_replica(self, replica: ReplicaId) -> None:
        """Drops every session held by ``replica`` (O(sessions); on replica removal only)."""
        self._last = {k: r for k, r in self._last.items() if r != replica}
        self._held.pop(replica, None)


def should_stick(costs: Mapping[ReplicaId, float], sticky: ReplicaId, overload_factor: float) -> bool:
    """True when the session's replica is a candidate and not worse than ``overload_factor`` x the best."""
    cost = costs.get(sticky)
    if cost is None:
        return False
    best = min(costs.values())
    return cost <= overload_factor * best
