"""The seams of a routing policy: filters, scorers and pickers, and the values between them.

A policy is a composition (after llm-d's scheduler profile), run by ``routing.pipeline.Pipeline``:

1. **Filters** drop replicas that must not get the request (unhealthy, draining).
2. One **scorer** gives every remaining replica a *cost* (lower is better; its docstring states the
   formula, unit and range) and, when it predicts time, the TTFT terms behind it (``Scored.terms``), so
   no later step computes them again.
3. A **picker** takes the replica to use; pickers wrap one another (a session-affinity picker around a
   tie-breaking picker, ...), each may name the ``Reason`` it changed the choice for.

Every stage has the same lifecycle hooks, with no-op defaults in ``Stage``: ``chose`` (the request went
to that replica: remember a session, insert into an own tree), ``forget`` (a replica left the fleet) and
``restart`` (its cache is gone). The pipeline calls them on every stage; nothing is found by probing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from routing.types import Candidate, Reason, ReplicaId, RoutingRequest, TtftTerms


class Scored(NamedTuple):
    """One candidate with its cost, and the TTFT terms when the scorer predicted them (a NamedTuple, as
    the per-candidate values of ``routing.types``)."""

    cand: Candidate
    cost: float
    terms: TtftTerms | None = None
    reason: Reason | None = None  # a scorer that decides the reason for every candidate (cache_aware)

    @property
    def id(self) -> ReplicaId:
        return self.cand.state.id


@dataclass(frozen=True, slots=True)
class Pick:
    chosen: Scored
    reason: Reason | None = None  # set by a picker that overrode the inner choice


class Lifecycle(Protocol):
    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None: ...

    def forget(self, replica: ReplicaId) -> None: ...

    def restart(self, replica: ReplicaId) -> None: ...


class Filter(Lifecycle, Protocol):
    name: str

    def filter(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Sequence[Candidate]: ...


class Scorer(Lifecycle, Protocol):
    """Returns a cost per candidate (lower is better); the docstring states the formula."""

    name: str

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]: ...


class Picker(Lifecycle, Protocol):
    def pick(self, req: RoutingRequest, scored: Sequence[Scored]) -> Pick: ...


class Stage:
    """Default lifecycle hooks: a stage that keeps no state about requests or replicas."""

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        return None

    def forget(self, replica: ReplicaId) -> None:
        return None

    def restart(self, replica: ReplicaId) -> None:
        return None
