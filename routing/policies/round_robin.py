"""Round robin: each request goes to the next healthy replica in id order.

``RotationScorer``: cost(r) = (position of r among the candidates in id order - turn) mod n, where the
turn advances by one per routed request; the picker takes the 0, and ``ranked`` is then the rotation
order starting at the pick, so a retry goes to the next one in turn. Adding or removing a replica
shifts the rotation but never skips a healthy replica for more than one turn. Cost: O(n log n) per
request (sorting n ids). Reason: always ROUND_ROBIN.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.pipeline import HealthyFilter, Pipeline, SeededPicker
from routing.protocols import Scored, Stage
from routing.types import Candidate, Reason, RoutingRequest


class RotationScorer(Stage):
    """cost(r) = (rank of r's id - turn) mod n (dimensionless, [0, n))."""

    name = "rotation"

    def __init__(self) -> None:
        self._turn = 0

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        n = len(cands)
        start = self._turn % n
        self._turn += 1
        order = sorted(range(n), key=lambda i: cands[i].state.id)
        cost = {i: float((rank - start) % n) for rank, i in enumerate(order)}
        return [Scored(c, cost[i]) for i, c in enumerate(cands)]


def round_robin() -> Pipeline:
    return Pipeline("round_robin", [HealthyFilter()], RotationScorer(), SeededPicker(), Reason.ROUND_ROBIN)
