"""Policies driven the way the Router drives them, for table tests of one policy at a time.

``PolicyHarness(name, cfg).route(req, cands)`` runs ``decide`` and tells the stages where the request
went (``chose``), as ``routing.router.Router`` does, and returns a ``Routed`` view of the decision with
the chosen candidate's match and TTFT terms; ``observe`` feeds one report to the rate learner the way
``Router.finish`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from routing.config import PolicyName, RoutingConfig
from routing.policies.factory import build_policy
from routing.rates import RateBook
from routing.ttft import predict_ttft
from routing.types import Candidate, Prediction, PrefixMatch, Reason, Report, RoutingRequest, TtftTerms


@dataclass(frozen=True, slots=True)
class Routed:
    replica: str
    reason: Reason
    cost: float
    ranked: tuple[str, ...]
    match: PrefixMatch
    terms: TtftTerms


class PolicyHarness:
    def __init__(self, name: PolicyName, cfg: RoutingConfig | None = None) -> None:
        self.cfg = dataclasses.replace(cfg or RoutingConfig(), policy=name)
        self.rates = RateBook(self.cfg)
        self.policy = build_policy(self.cfg, self.rates)

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Routed:
        choice = self.policy.decide(req, cands)
        d, chosen = choice.decision, choice.chosen
        self.policy.chose(req, d.replica)
        rates = self.rates.get(d.replica)
        terms = chosen.terms or predict_ttft(req, chosen.cand, rates, self.cfg.default_new_tokens)
        return Routed(d.replica, d.reason, d.cost, d.ranked, chosen.cand.match, terms)

    def observe(self, req: RoutingRequest, routed: Routed, report: Report) -> None:
        self.rates.observe(req, Prediction(routed.replica, routed.match, routed.terms), report)

    def forget(self, replica: str) -> None:
        self.rates.forget(replica)
        self.policy.forget(replica)
