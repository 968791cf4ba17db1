"""The routing pipeline: filters → scorer → picker, for every policy (see ``routing.protocols``).

``Pipeline.decide`` is pure apart from the stages' own learned state (round-robin position, session
table, the cache_aware tree): it filters, scores each remaining candidate once, lets the picker choose,
names the ``Reason`` (the picker's, else the scorer's, else the policy's ``explain``) and returns a
``Choice``: the ``Decision`` (chosen replica first in ``ranked``, the others by cost, for retries) and the
chosen candidate's ``Scored`` entry. Nothing here does I/O, reads the clock or the environment.

Tie-breaking is always seeded, never "the first one" (llm-d-router PR #2515): ``SeededPicker`` takes the
lowest cost, and costs within ``rel_tol`` (relative) or ``abs_tol`` of it tie and are drawn from.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from routing.protocols import Filter, Pick, Picker, Scored, Scorer, Stage
from routing.types import Candidate, Decision, Reason, ReplicaId, RoutingRequest

Explain = Callable[[RoutingRequest, Scored, Sequence[Scored]], Reason]
_COST = operator.itemgetter(1)  # Scored.cost, as a C-level sort key


class NoCandidates(Exception):
    """Every replica was filtered out; the proxy answers 503."""


@dataclass(frozen=True, slots=True)
class Choice:
    decision: Decision
    chosen: Scored


class HealthyFilter(Stage):
    """Keeps replicas that are healthy and not draining."""

    name = "healthy"

    def filter(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Sequence[Candidate]:
        return [c for c in cands if c.state.healthy and not c.state.draining]


def near_ties(scored: Sequence[Scored], rel_tol: float, abs_tol: float) -> list[Scored]:
    """The entries whose cost is within the tolerance of the lowest."""
    if not scored:
        raise NoCandidates("no candidate to pick from")
    best = min(s.cost for s in scored)
    limit = best + max(abs_tol, abs(best) * rel_tol)
    return [s for s in scored if s.cost <= limit]


class SeededPicker(Stage):
    """Lowest cost wins; costs within ``rel_tol`` (relative) or ``abs_tol`` of the best tie, and a seeded
    draw breaks the tie. O(n) per pick."""

    def __init__(self, seed: int = 0, rel_tol: float = 0.0, abs_tol: float = 1e-9) -> None:
        self._rng = random.Random(seed)
        self._rel_tol = rel_tol
        self._abs_tol = abs_tol

    def pick(self, req: RoutingRequest, scored: Sequence[Scored]) -> Pick:
        ties = near_ties(scored, self._rel_tol, self._abs_tol)
        return Pick(ties[0] if len(ties) == 1 else self._rng.choice(ties))


class Pipeline:
    """A named composition of filters, one scorer and a picker (see the module docstring)."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorer: Scorer,
        picker: Picker,
        explain: Explain | Reason,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorer = scorer
        self.picker = picker
        self._explain = explain

    def decide(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Choice:
        """Raises NoCandidates when every replica is filtered out."""
        for f in self.filters:
            cands = f.filter(req, cands)
        if not cands:
            raise NoCandidates("no healthy replica")
        scored = self.scorer.score(req, cands)
        pick = self.picker.pick(req, scored)
        chosen = pick.chosen
        reason = pick.reason or chosen.reason or self._reason(req, chosen, scored)
        others = sorted((s for s in scored if s is not chosen), key=_COST)
        ranked = (chosen.id, *(s.id for s in others))
        return Choice(Decision(chosen.id, reason, chosen.cost, ranked), chosen)

    def _reason(self, req: RoutingRequest, chosen: Scored, scored: Sequence[Scored]) -> Reason:
        explain = self._explain
        return explain if isinstance(explain, Reason) else explain(req, chosen, scored)

    def stages(self) -> tuple[Filter | Scorer | Picker, ...]:
        return (*self.filters, self.scorer, self.picker)

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        for stage in self.stages():
            stage.chose(req, replica)

    def forget(self, replica: ReplicaId) -> None:
        for stage in self.stages():
            stage.forget(replica)

    def restart(self, replica: ReplicaId) -> None:
        for stage in self.stages():
            stage.restart(replica)
