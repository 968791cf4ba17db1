"""Round robin: each request goes to the next healthy replica in id order.

The counter advances once per routed request. Replicas are ordered by id, so adding or removing one
shifts the rotation but never skips a healthy replica for more than one turn. ``ranked`` lists the
replicas in rotation order starting at the pick, so a retry goes to the next one in turn.
Cost: O(n log n) per request (sorting n ids). Reason: always ROUND_ROBIN.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.pipeline import HealthyFilter, NoCandidates, Outcome
from routing.types import Candidate, Decision, Reason, RoutingRequest


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0
        self._filter = HealthyFilter()

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision:
        ids = sorted(c.id for c in self._filter.filter(req, cands))
        if not ids:
            raise NoCandidates("no healthy replica")
        start = self._next % len(ids)
        self._next += 1
        order = tuple(ids[start:] + ids[:start])
        return Decision(replica=order[0], reason=Reason.ROUND_ROBIN, ranked=order)

    def observe(self, outcome: Outcome) -> None:
        return None
