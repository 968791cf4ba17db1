"""Cost scorers of the default policy: predicted time to first token, in seconds, term by term.

For a request with P estimated prompt tokens and a candidate whose cache model match is
(G gpu, H host, S storage) tokens, with the replica's learned rates (``routing.rates``):

    uncached  = max(0, P - G - H - S)
    queued    = inflight_prefill_tokens - head / 2
    head      = inflight_prefill_tokens / max(1, inflight_requests)
    queue_s   = queued / prefill_rate + slot_wait
    slot_wait = (inflight_requests - max_running + 1) / max_running x service_s
                    when inflight_requests >= max_running_requests (> 0), else 0
    prefill_s = uncached / prefill_rate
    reload_s  = H / host_rate + S / storage_rate
    overhead  = the learned fixed per-request time
    ttft      = queue_s + prefill_s + reload_s + overhead

Every term is in seconds, range [0, inf), O(1) per candidate. ``inflight_prefill_tokens`` are the
uncached prompt tokens routed to the replica whose first token has not come back: the prefill work
this request queues behind. Past ``max_running_requests`` a request also waits for running ones to
finish: each slot frees after about one mean service time, shared by ``max_running`` slots. The job at
the head of the prefill queue is on average half done when a request arrives (``head`` estimates its
size as the mean prefill per in-flight request); without that discount a holder whose queue equals one
cold prefill would tie with an idle replica that has to compute the whole prompt.

``LoadTiePicker``: the lowest total wins; totals within ``rel_tol`` (relative) or ``abs_tol`` (seconds)
of the best are a tie, broken by the fewest prefill tokens in flight, then by the replica chosen least
recently, then by a seeded draw, never by list order, so misses spread over idle replicas and a hot
prefix is copied to an idle replica once its holder's queue makes the two cost the same. Requests that
are only decoding do not count: they do not hold up a prefill (SGLang runs prefill batches between
decode steps), and counting them sent misses away from the replicas serving popular documents and piled
new documents, with their cold prefills, on the others (bench rag: mean TTFT -7% over 3 seeds).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from routing.pipeline import NoCandidates
from routing.rates import RateBook, ReplicaRates
from routing.types import Candidate, ReplicaId, ReplicaState, RoutingRequest


@dataclass(frozen=True, slots=True)
class TtftTerms:
    queue_s: float
    prefill_s: float
    reload_s: float
    overhead_s: float
    uncached_tokens: float

    @property
    def total(self) -> float:
        return self.queue_s + self.prefill_s + self.reload_s + self.overhead_s


def slot_wait_s(state: ReplicaState, service_s: float) -> float:
    """Expected wait for a running slot (0 while the replica has free slots or an unknown limit)."""
    limit = state.max_running_requests
    if limit <= 0 or state.inflight_requests < limit:
        return 0.0
    return (state.inflight_requests - limit + 1) / limit * service_s


def queued_prefill_tokens(state: ReplicaState) -> float:
    """Prefill tokens a new request waits behind: all in flight, minus half the head job's."""
    tokens = float(state.inflight_prefill_tokens)
    return tokens - 0.5 * tokens / max(1, state.inflight_requests)


def predict_ttft(req: RoutingRequest, cand: Candidate, rates: ReplicaRates) -> TtftTerms:
    """The predicted TTFT of ``req`` on ``cand``, term by term (module docstring)."""
    m, st = cand.match, cand.state
    uncached = max(0.0, req.prompt_tokens - m.total_tokens)
    queue = queued_prefill_tokens(st) / rates.prefill_tokens_per_s + slot_wait_s(st, rates.service_s)
    reload = m.host_tokens / rates.host_tokens_per_s + m.storage_tokens / rates.storage_tokens_per_s
    return TtftTerms(queue, uncached / rates.prefill_tokens_per_s, reload, rates.overhead_s, uncached)


class QueueScorer:
    """queue_s = queued prefill tokens / prefill_rate + slot_wait (seconds)."""

    name = "queue_s"

    def __init__(self, rates: RateBook) -> None:
        self._rates = rates

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Mapping[ReplicaId, float]:
        return {c.id: predict_ttft(req, c, self._rates.get(c.id)).queue_s for c in cands}


class PrefillScorer:
    """prefill_s = max(0, P - G - H - S) / prefill_rate (seconds)."""

    name = "prefill_s"

    def __init__(self, rates: RateBook) -> None:
        self._rates = rates

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Mapping[ReplicaId, float]:
        return {c.id: predict_ttft(req, c, self._rates.get(c.id)).prefill_s for c in cands}


class ReloadScorer:
    """reload_s = H / host_rate + S / storage_rate (seconds)."""

    name = "reload_s"

    def __init__(self, rates: RateBook) -> None:
        self._rates = rates

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Mapping[ReplicaId, float]:
        return {c.id: predict_ttft(req, c, self._rates.get(c.id)).reload_s for c in cands}


class OverheadScorer:
    """overhead_s = the replica's learned fixed time per request (seconds)."""

    name = "overhead_s"

    def __init__(self, rates: RateBook) -> None:
        self._rates = rates

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Mapping[ReplicaId, float]:
        return {c.id: self._rates.get(c.id).overhead_s for c in cands}


class LoadTiePicker:
    """Lowest cost; near-ties go to the fewest prefill tokens in flight, then to the one this picker
    chose least recently (so sequential misses at low concurrency rotate over idle replicas instead of
    clustering, and their GPU and host pools fill evenly), then to a seeded draw (replicas never chosen
    yet). O(n) per pick."""

    def __init__(self, seed: int, rel_tol: float, abs_tol: float = 1e-9) -> None:
        self._rng = random.Random(seed)
        self._rel_tol = rel_tol
        self._abs_tol = abs_tol
        self._clock = 0
        self._last_pick: dict[ReplicaId, int] = {}

    def ties(self, scored: Sequence[tuple[Candidate, float]]) -> list[Candidate]:
        """Candidates whose cost is within the tolerance of the best."""
        if not scored:
            raise NoCandidates("no candidate to pick from")
        best = min(cost for _, cost in scored)
        limit = best + max(self._abs_tol, abs(best) * self._rel_tol)
        return [c for c, cost in scored if cost <= limit]

    def pick(self, scored: Sequence[tuple[Candidate, float]]) -> Candidate:
        ties = self.ties(scored)
        if len(ties) == 1:
            return ties[0]
        least = min(c.state.inflight_prefill_tokens for c in ties)
        idle = [c for c in ties if c.state.inflight_prefill_tokens == least]
        if len(idle) > 1:
            oldest = min(self._last_pick.get(c.id, -1) for c in idle)
            idle = [c for c in idle if self._last_pick.get(c.id, -1) == oldest]
        chosen = idle[0] if len(idle) == 1 else self._rng.choice(idle)
        self._clock += 1
        self._last_pick[chosen.id] = self._clock
        return chosen

    def forget(self, replica: ReplicaId) -> None:
        self._last_pick.pop(replica, None)
