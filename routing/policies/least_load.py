"""Least load, counted in tokens: the replica with the least prefill work in flight.

Cost of replica r (tokens, lower is better, range [0, inf)):

    load(r) = inflight_prefill_tokens(r) + tokens_per_request x inflight_requests(r)

``inflight_prefill_tokens`` are the estimated uncached prompt tokens routed to r whose first token has
not come back yet (the prefill queue the request would wait behind); the per-request weight stands for
the decode work and scheduling slots of requests already past prefill. Counting requests alone (as
sglang-router's balance check does) treats a 40K-token prompt like a 10-token one. Costs within the
picker's tolerance tie and a seeded draw breaks the tie, so idle replicas share misses evenly instead
of "the first one" getting them all. Cost: O(n) per request. Reason: always LEAST_LOAD.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, Pipeline, SeededPicker
from routing.protocols import Scored, Stage
from routing.types import Candidate, Reason, RoutingRequest


class LoadScorer(Stage):
    """load(r) = inflight_prefill_tokens + tokens_per_request x inflight_requests (tokens)."""

    name = "load"

    def __init__(self, tokens_per_request: int) -> None:
        self.tokens_per_request = tokens_per_request

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        per = self.tokens_per_request
        return [
            Scored(c, float(c.state.inflight_prefill_tokens + per * c.state.inflight_requests)) for c in cands
        ]


def least_load(cfg: RoutingConfig) -> Pipeline:
    scorer = LoadScorer(cfg.tokens_per_request)
    return Pipeline("least_load", [HealthyFilter()], scorer, SeededPicker(cfg.seed), Reason.LEAST_LOAD)
