"""What one run of one system on one scenario produced, and the statistics the reports read.

``RunResult``: per request its TTFT (modelled seconds from when it was due: its arrival, or for a
session's next turn the end of the previous answer plus the think time), cached tokens and replica; per
replica its request share and idle-while-queued seconds (``bench.sim.balance``). A replica's share is
the requests it received over the requests routed while it could take them (in the fleet and not
draining), so a replica that joined late is not counted as starved for the time it was absent.

Every value is a plain number or string, so results cross process boundaries and serialise to JSON
(``to_json``) as they are; floats are kept exact (no rounding before the reports).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

P99 = 0.99


class HasTtfts(Protocol):
    @property
    def ttfts(self) -> Sequence[float]: ...


class TtftFigures:
    """The mean and p99 of a run's ``ttfts`` (the requests that got a first token): one place for the
    simulated runs here and the real ones (``bench.confirm.trial``)."""

    __slots__ = ()

    @property
    def mean_ttft(self: HasTtfts) -> float:
        return mean(self.ttfts)

    @property
    def p99_ttft(self: HasTtfts) -> float:
        return quantile(self.ttfts, P99)


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    tag: str
    replica: str
    due_s: float
    ttft_s: float | None  # None: it failed before its first token
    cached_tokens: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    replica: str
    requests: int
    eligible: int  # requests routed while it was in the fleet and not draining
    idle_while_queued_s: float

    @property
    def share(self) -> float:
        return self.requests / self.eligible if self.eligible else math.nan


@dataclass(frozen=True, slots=True)
class RunResult(TtftFigures):
    system: str
    requests: tuple[RequestResult, ...]
    replicas: tuple[ReplicaResult, ...]
    end_s: float  # virtual time when the last answer ended

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.requests if r.ttft_s is not None]

    @property
    def errors(self) -> int:
        return sum(r.ttft_s is None for r in self.requests)

    @property
    def idle_while_queued_s(self) -> float:
        return sum(r.idle_while_queued_s for r in self.replicas)

    @property
    def min_share(self) -> float:
        shares = [r.share for r in self.replicas if r.eligible]
        return min(shares) if shares else math.nan

    @property
    def hit_ratio(self) -> float:
        prompt = sum(r.prompt_tokens for r in self.requests)
        return sum(r.cached_tokens for r in self.requests) / prompt if prompt else math.nan

    def starved(self, share: float) -> list[ReplicaResult]:
        """Replicas that received less than ``share`` of the requests while idle as others queued."""
        return [r for r in self.replicas if r.eligible and r.share < share and r.idle_while_queued_s > 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "end_s": self.end_s,
            "requests": [asdict(r) for r in self.requests],
            "replicas": [asdict(r) | {"share": r.share} for r in self.replicas],
        }


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile (the smallest value with at least q of the values at or below it)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
