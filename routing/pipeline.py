"""The routing pipeline: filters → scorers → picker, and the seams around it.

A policy is a composition, not a class hierarchy (after llm-d's scheduler profile):

1. **Filters** drop replicas that must not get the request (unhealthy, draining, wrong model).
2. **Scorers** each return a *cost* per remaining replica (lower is better; the docstring of each
   scorer states its formula, unit, range and cost). Weights live in the pipeline, not in scorers.
3. The **picker** takes the replica with the lowest weighted cost; replicas within a tolerance of the
   best are a tie, broken by a seeded random draw, never by list order (llm-d-router PR #2515).

The pipeline is pure and synchronous. State that a policy learns (rates, session maps, round-robin
counters) lives in the policy object and changes only in ``route`` and ``observe``; nothing here does
I/O, reads the clock or the environment.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from routing.types import Candidate, Decision, PrefixMatch, Reason, ReplicaId, ReplicaState, RoutingRequest


class NoCandidates(Exception):
    """Every replica was filtered out; the proxy answers 503."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the proxy learned once a routed request finished (or failed)."""

    request: RoutingRequest
    decision: Decision
    ok: bool
    prompt_tokens: int | None = None  # usage.prompt_tokens as the replica reported it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, None when not reported
    ttft_s: float | None = None  # time to first byte of the response body, seconds


class Filter(Protocol):
    name: str

    def filter(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Sequence[Candidate]: ...


class Scorer(Protocol):
    """Returns a cost per candidate (lower is better); the docstring states the formula."""

    name: str

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Mapping[ReplicaId, float]: ...


class Picker(Protocol):
    def pick(self, scored: Sequence[tuple[Candidate, float]]) -> Candidate: ...


class Policy(Protocol):
    """A routing policy: a pure decision plus optional learning from outcomes."""

    name: str

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision: ...

    def observe(self, outcome: Outcome) -> None: ...


class PrefixIndex(Protocol):
    """What the proxy asks of a cache model: matches before routing, records and corrections after."""

    def match(
        self, req: RoutingRequest, replicas: Sequence[ReplicaState]
    ) -> Mapping[ReplicaId, PrefixMatch]: ...

    def record(self, req: RoutingRequest, decision: Decision) -> None: ...

    def observe(self, outcome: Outcome) -> None: ...

    def forget(self, replica: ReplicaId) -> None:
        """The replica left the fleet: drop everything known of it."""
        ...

    def restart(self, replica: ReplicaId) -> None:
        """Its GPU and host tiers are gone, its storage tier survives (a restart, a cache flush)."""
        ...


@runtime_checkable
class FleetSync(Protocol):
    """A prefix index that wants every fleet snapshot (capacities, write policy, restarts) before it
    matches; the proxy calls ``sync`` with the candidates' states on each routing decision."""

    def sync(self, replicas: Sequence[ReplicaState]) -> None: ...


class NullPrefixIndex:
    """A prefix index that knows nothing: every match is empty (for prefix-blind policies)."""

    def match(self, req: RoutingRequest, replicas: Sequence[ReplicaState]) -> Mapping[ReplicaId, PrefixMatch]:
        return {}

    def record(self, req: RoutingRequest, decision: Decision) -> None:
        return None

    def observe(self, outcome: Outcome) -> None:
        return None

    def forget(self, replica: ReplicaId) -> None:
        return None

    def restart(self, replica: ReplicaId) -> None:
        return None


class HealthyFilter:
    """Keeps replicas that are healthy and not draining."""

    name = "healthy"

    def filter(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Sequence[Candidate]:
        return [c for c in cands if c.state.healthy and not c.state.draining]


class SeededPicker:
    """Lowest cost wins; costs within ``rel_tol`` (relative) or ``abs_tol`` of the best tie, and a
    seeded draw breaks the tie. O(n) per pick."""

    def __init__(self, seed: int = 0, rel_tol: float = 0.0, abs_tol: float = 1e-9) -> None:
        self._rng = random.Random(seed)
        self._rel_tol = rel_tol
        self._abs_tol = abs_tol

    def pick(self, scored: Sequence[tuple[Candidate, float]]) -> Candidate:
        if not scored:
            raise NoCandidates("no candidate to pick from")
        best = min(cost for _, cost in scored)
        limit = best + max(self._abs_tol, abs(best) * self._rel_tol)
        ties = [cand for cand, cost in scored if cost <= limit]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0


class Pipeline:
    """Runs filters, weighted scorers and the picker; returns the pick and the ranked costs."""

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[WeightedScorer], picker: Picker) -> None:
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker

    def run(
        self, req: RoutingRequest, cands: Sequence[Candidate]
    ) -> tuple[Candidate, list[tuple[Candidate, float]]]:
        """Returns (picked, [(candidate, total cost)] sorted by cost); raises NoCandidates."""
        for f in self.filters:
            cands = f.filter(req, cands)
        if not cands:
            raise NoCandidates("no healthy replica")
        totals = {c.id: 0.0 for c in cands}
        for ws in self.scorers:
            costs = ws.scorer.score(req, cands)
            for c in cands:
                totals[c.id] += ws.weight * costs.get(c.id, 0.0)
        scored = [(c, totals[c.id]) for c in cands]
        picked = self.picker.pick(scored)
        ranked = sorted(scored, key=lambda cs: (cs[0] is not picked, cs[1]))
        return picked, ranked

    def breakdown(
        self, req: RoutingRequest, cands: Sequence[Candidate], replica: ReplicaId
    ) -> dict[str, float]:
        """Per-scorer cost of one replica (for /status and debugging; not on the hot path)."""
        return {ws.scorer.name: ws.scorer.score(req, cands).get(replica, 0.0) for ws in self.scorers}


def decision_from(
    picked: Candidate, ranked: Sequence[tuple[Candidate, float]], reason: Reason, **extra: float
) -> Decision:
    """Builds a Decision whose ``ranked`` order lets the proxy retry on the next replica."""
    cost = next(cost for cand, cost in ranked if cand is picked)
    return Decision(
        replica=picked.id,
        reason=reason,
        predicted_cost=cost,
        predicted_cached_tokens=extra.pop("predicted_cached_tokens", 0.0),
        breakdown=dict(extra),
        ranked=tuple(c.id for c, _ in ranked),
    )
