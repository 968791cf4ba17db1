"""The default policy ("cost"): send each request where its predicted time to first token is lowest.

Steps of ``route`` (produce, score, pick, then two guards; each exit names a Reason):

1. Filter: healthy, not draining replicas (``HealthyFilter``).
2. Score: predicted TTFT = queue + prefill of the uncached tokens + host/storage reload + overhead,
   one scorer per term (``routing.scorers``), with per-replica rates learned online
   (``routing.rates``). A shared prefix that is cached everywhere costs the same everywhere, so it
   does not attract traffic; a long document cached on one replica makes that replica cheaper by its
   whole prefill time; a document evicted to host memory is a cheap reload there and a cold prefill
   elsewhere.
3. Pick: lowest cost; costs within ``tie_rel_tol`` (or ``tie_abs_s``) of the best tie and go to the
   fewest prefill tokens in flight, then to the least recently chosen, then to a seeded draw
   (``LoadTiePicker``), so misses spread evenly over idle replicas.
4. Session affinity: a session returns to the replica of its previous turn unless that replica's
   predicted TTFT exceeds the best by ``session_overload_factor`` (Reason SESSION when it changed the
   pick). A new session avoids replicas holding more than ``hot_spill_factor`` x the fewest sessions
   any replica holds + 1 (Reason FALLBACK when that moved it), so a shared system prompt does not
   gather every session on its first holders and no replica is left without sessions.
5. Hot-spot guard: if the chosen replica would hold more than ``hot_spill_factor`` x the fleet's mean
   in-flight requests (and at least ``hot_min_inflight``), the best replica below that bound takes the
   request instead (Reason FALLBACK). One cold prefill there replicates a hot prefix, after which the
   tie-break spreads its requests, keeping per-replica request counts near the mean.

Reasons: PREFIX_GPU / PREFIX_HOST / PREFIX_STORAGE when the chosen replica's match is at least one
block and mostly in that tier, LEAST_COST otherwise, FALLBACK when a tie was broken away from a replica
holding a longer prefix (or the hot-spot guard moved the request), SESSION when affinity held.
``observe`` feeds the rate learner. Cost: O(replicas) per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, Outcome, Pipeline, WeightedScorer, decision_from
from routing.rates import RateBook
from routing.scorers import (
    LoadTiePicker,
    OverheadScorer,
    PrefillScorer,
    QueueScorer,
    ReloadScorer,
    predict_ttft,
)
from routing.session import SessionTable, should_stick
from routing.types import Candidate, Decision, Reason, ReplicaId, RoutingRequest


class CostPolicy:
    name = "cost"

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self.rates = RateBook(cfg)
        self.sessions = SessionTable(cfg.max_sessions)
        scorers = (QueueScorer(self.rates), PrefillScorer(self.rates), ReloadScorer(self.rates))
        self._picker = LoadTiePicker(cfg.seed, cfg.tie_rel_tol, cfg.tie_abs_s)
        self._pipeline = Pipeline(
            filters=[HealthyFilter()],
            scorers=[WeightedScorer(s) for s in (*scorers, OverheadScorer(self.rates))],
            picker=self._picker,
        )

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision:
        picked, ranked = self._pipeline.run(req, cands)
        chosen, reason = self._guards(req, picked, ranked)
        if reason is None:
            reason = self._reason(req, chosen, ranked)
        self.sessions.remember(req.session_key, chosen.id)
        ordered = [
            (chosen, _cost(ranked, chosen)),
            *sorted((cs for cs in ranked if cs[0] is not chosen), key=lambda cs: cs[1]),
        ]
        terms = predict_ttft(req, chosen, self.rates.get(chosen.id))
        m = chosen.match
        return decision_from(
            chosen,
            ordered,
            reason,
            predicted_cached_tokens=m.total_tokens,
            queue_s=terms.queue_s,
            prefill_s=terms.prefill_s,
            reload_s=terms.reload_s,
            overhead_s=terms.overhead_s,
            uncached_tokens=terms.uncached_tokens,
            gpu_tokens=m.gpu_tokens,
            host_tokens=m.host_tokens,
            storage_tokens=m.storage_tokens,
        )

    def observe(self, outcome: Outcome) -> None:
        self.rates.observe(outcome)

    def forget(self, replica: ReplicaId) -> None:
        """A replica left the fleet: drop its learned rates and the sessions it held."""
        self.rates.forget(replica)
        self.sessions.forget_replica(replica)
        self._picker.forget(replica)

    # ---- steps --------------------------------------------------------------------------------------
    def _guards(
        self, req: RoutingRequest, picked: Candidate, ranked: list[tuple[Candidate, float]]
    ) -> tuple[Candidate, Reason | None]:
        """Session affinity, then the hot-spot guard; a Reason when either changed the pick."""
        chosen, reason = picked, None
        sticky = self.sessions.get(req.session_key)
        if sticky is not None and sticky != picked.id:
            costs = {c.id: cost for c, cost in ranked}
            if should_stick(costs, sticky, self._cfg.session_overload_factor):
                chosen, reason = next(c for c, _ in ranked if c.id == sticky), Reason.SESSION
        elif sticky is None and req.session_key:
            crowded = self.sessions.crowded([c.id for c, _ in ranked], self._cfg.hot_spill_factor)
            if picked.id in crowded:
                roomy = [(c, cost) for c, cost in ranked if c.id not in crowded]
                chosen, reason = self._picker.pick(roomy), Reason.FALLBACK
        if self._hot(chosen, ranked):
            cool = [(c, cost) for c, cost in ranked if not self._hot(c, ranked)]
            if cool:
                return min(cool, key=lambda cs: cs[1])[0], Reason.FALLBACK
        return chosen, reason

    def _hot(self, cand: Candidate, ranked: Sequence[tuple[Candidate, float]]) -> bool:
        """Would one more request put ``cand`` above the hot-spot bound?"""
        cfg = self._cfg
        if cfg.hot_spill_factor <= 0 or len(ranked) < 2:
            return False
        after = cand.state.inflight_requests + 1
        mean_after = (sum(c.state.inflight_requests for c, _ in ranked) + 1) / len(ranked)
        return after > max(cfg.hot_min_inflight, cfg.hot_spill_factor * mean_after)

    def _reason(
        self, req: RoutingRequest, chosen: Candidate, ranked: Sequence[tuple[Candidate, float]]
    ) -> Reason:
        best = min(ranked, key=lambda cs: cs[1])[0]
        block = max(req.block_tokens, 1e-9)
        if best is not chosen and best.match.total_tokens >= chosen.match.total_tokens + block:
            return Reason.FALLBACK
        m = chosen.match
        if m.total_tokens < block:
            return Reason.LEAST_COST
        tiers = (
            (m.gpu_tokens, Reason.PREFIX_GPU),
            (m.host_tokens, Reason.PREFIX_HOST),
            (m.storage_tokens, Reason.PREFIX_STORAGE),
        )
        return max(tiers, key=lambda t: t[0])[1]


def _cost(ranked: Sequence[tuple[Candidate, float]], cand: Candidate) -> float:
    return next(cost for c, cost in ranked if c is cand)
