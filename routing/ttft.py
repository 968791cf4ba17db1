"""Predicted time to first token, in seconds, term by term: the cost of the default policy.

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

``TtftScorer`` computes the terms once per candidate and keeps them in its ``Scored`` entries: the cost
is their total, and the chosen candidate's terms become the request's ``Prediction``.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.protocols import Scored, Stage
from routing.rates import RateBook, ReplicaRates
from routing.types import Candidate, ReplicaState, RoutingRequest, TtftTerms


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
    prefill_rate = rates.prefill_tokens_per_s
    uncached = max(0.0, req.prompt_tokens - m.gpu_tokens - m.host_tokens - m.storage_tokens)
    queue = queued_prefill_tokens(st) / prefill_rate if st.inflight_prefill_tokens else 0.0
    if st.max_running_requests > 0 and st.inflight_requests >= st.max_running_requests:
        queue += slot_wait_s(st, rates.service_s)
    reload = m.host_tokens / rates.host_tokens_per_s if m.host_tokens else 0.0
    if m.storage_tokens:
        reload += m.storage_tokens / rates.storage_tokens_per_s
    return TtftTerms(queue, uncached / prefill_rate, reload, rates.overhead_s, uncached)


class TtftScorer(Stage):
    """cost = predicted TTFT = queue_s + prefill_s + reload_s + overhead_s (seconds, [0, inf))."""

    name = "ttft"

    def __init__(self, rates: RateBook) -> None:
        self._rates = rates

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        """``predict_ttft`` for every candidate, inlined (it runs once per replica per request)."""
        rates, prompt = self._rates.get, req.prompt_tokens
        out: list[Scored] = []
        append = out.append
        for c in cands:
            st, m = c.state, c.match
            r = rates(st.id)
            uncached = prompt - m.gpu_tokens - m.host_tokens - m.storage_tokens
            prefill = (uncached if uncached > 0.0 else 0.0) / r.prefill_tokens_per_s
            queue = queued_prefill_tokens(st) / r.prefill_tokens_per_s if st.inflight_prefill_tokens else 0.0
            if st.max_running_requests > 0 and st.inflight_requests >= st.max_running_requests:
                queue += slot_wait_s(st, r.service_s)
            reload = m.host_tokens / r.host_tokens_per_s if m.host_tokens else 0.0
            if m.storage_tokens:
                reload += m.storage_tokens / r.storage_tokens_per_s
            terms = TtftTerms(queue, prefill, reload, r.overhead_s, max(uncached, 0.0))
            append(Scored(c, queue + prefill + reload + r.overhead_s, terms))
        return out
