"""Placement that prices what a choice does to the fleet, not only to this request.

Sending request q to replica r costs q its own time to first token, and costs every request that will
arrive at r while q's work is still ahead of it the time q's work takes. With, for replica r:

    x   = q's own work there: prefill of its uncached tokens + reload of its host/storage tokens (s)
    W   = the wait ahead of it: queued prefill and running-slot wait, or KV-memory wait (s)  (routing.ttft)
    λ   = the rate of requests recently routed to r (1/s)
    ρ   = r's recent prefill utilization: the measured fraction of time its engine spent serving
          prefills (from the first bytes, proxy/fleet/load.py), bias-corrected at start-up, capped at
          max_utilization (0.95)

the delay q imposes on the others is x for each request arriving before r's backlog W + x has drained;
by the M/G/1 busy-period argument that is λ (W + x) / (1 - ρ) requests. The placement cost is

    cost(r) = ttft(r) + x · λ · (W + x) / (1 - ρ) - worth(r)       (seconds, O(1) per replica)

**What a copy is worth.** The delay term prices what a copy costs the others; a copy is also worth
something: the requests that share the same prefix later, which can then be served where it was copied
instead of queueing behind its holders. With the request's shared prefix P (the longest prefix any
replica holds, ``routing.demand``), its holders H (the replicas holding at least 90% of it, k of them),
W_H the shortest wait among them, λ_P = P's share of recent requests x the fleet's arrival rate:

    worth(r) = γ · λ_P · (W_H + x) · max(0, W_H - W) / (k + 1)     for a replica r outside H, else 0

the requests of P arriving while the copy is made (λ_P (W_H + x)), each spared the wait it would have
had behind the holders beyond r's own (W_H - W), shared among the k + 1 holders there would then be
(γ = ``copy_worth``). Without demand (λ_P = 0) or when the holders do not queue more than r, nothing
changes; a popular prefix whose holders queue is copied to an idle replica before its requests pile
up, instead of one at a time after they have.

Why this beats both greedy and sticky routing:

- **Greedy** (ttft alone) sends a hit away from its holder as soon as the holder's queue exceeds one
  cold prefill elsewhere: the cold copy then delays everyone behind it there, takes GPU space from
  other documents there, and the next requests for that document find it in two places, so its
  hits spread and its copies multiply. In the cost above a hit's x is small (a reload, a few question
  tokens), so it adds little for anyone; a cold copy's x is a whole document, which a busy replica
  (large λ, ρ) pays for many times. A document is replicated only when its holder's own queue
  outweighs that, i.e. when the holder approaches saturation: 1 / (1 - ρ) grows without bound there.
- **Sticky** routing (sglang-router's cache_aware) keeps hits on their holder until request counts are
  badly imbalanced, so a popular document's holder saturates while others idle, and it places misses by
  request counts, which count decoding requests that hold up no prefill. Here the holder's saturation
  is priced in time, and misses go where the work they add delays the fewest requests: at low load
  (λ → 0) the cost is ttft, i.e. greedy, which is right when capacity is free.

Requests that are only decoding add nothing to W, λ's work or ρ: they hold up no prefill. They count only
through what they hold: running slots and KV memory (``routing.ttft.slot_wait_s``, ``memory_wait_s``).
Sessions and tie-breaks are the pickers' business (``routing.policies.cost``).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.demand import DemandBook, prefix_key
from routing.protocols import Scored, Stage
from routing.rates import RateBook
from routing.ttft import predict_ttft
from routing.types import BlockHash, Candidate, ReplicaId, RoutingRequest, TtftTerms

HOLDER_FRACTION = 0.9  # a replica holding this much of the shared prefix holds it


def imposed_delay_s(x: float, wait: float, arrival_rate: float, utilization: float, cap: float) -> float:
    """x · λ · (W + x) / (1 - ρ): the delay a request with own work x imposes on later arrivals."""
    if x <= 0.0 or arrival_rate <= 0.0:
        return 0.0
    rho = min(max(utilization, 0.0), cap)
    return x * arrival_rate * (wait + x) / (1.0 - rho)


def copy_worth_s(lam_p: float, x: float, holders_wait: float, wait: float, holders: int) -> float:
    """λ_P · (W_H + x) · max(0, W_H - W) / (k + 1): what a copy spares the prefix's later requests."""
    if lam_p <= 0.0 or holders_wait <= wait:
        return 0.0
    return lam_p * (holders_wait + x) * (holders_wait - wait) / (holders + 1)


class PlacementScorer(Stage):
    """cost(r) = ttft(r) + x · λ · (W + x) / (1 - ρ) - worth(r) (seconds; see the module docstring)."""

    name = "placement"

    def __init__(
        self,
        rates: RateBook,
        default_tokens: int,
        max_utilization: float,
        copy_worth: float = 0.0,
        demand: DemandBook | None = None,
    ) -> None:
        self._rates = rates
        self._default_tokens = default_tokens
        self._cap = max_utilization
        self._gamma = copy_worth
        self.demand = demand or DemandBook()
        self._keyed: tuple[RoutingRequest, BlockHash | None] | None = None  # the last request scored

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        rates, tokens, cap = self._rates.get, self._default_tokens, self._cap
        terms = [predict_ttft(req, c, rates(c.state.id), tokens) for c in cands]
        worth = self._worth(req, cands, terms)
        out: list[Scored] = []
        for c, t in zip(cands, terms, strict=True):
            st, x = c.state, t.prefill_s + t.reload_s
            extra = imposed_delay_s(x, t.queue_s, st.arrival_rate, st.utilization, cap)
            out.append(Scored(c, t.queue_s + x + t.overhead_s + extra - worth.get(c.id, 0.0), t))
        return out

    def _worth(
        self, req: RoutingRequest, cands: Sequence[Candidate], terms: Sequence[TtftTerms]
    ) -> dict[ReplicaId, float]:
        """worth(r) for the replicas outside the shared prefix's holders (module docstring)."""
        key, longest = prefix_key(req, cands)
        self._keyed = (req, key)
        lam_p = self._gamma * self.demand.share(key) * sum(c.state.arrival_rate for c in cands)
        if lam_p <= 0.0:
            return {}
        holds = [c.match.total_tokens >= HOLDER_FRACTION * longest for c in cands]
        holders_wait = min(t.queue_s for t, h in zip(terms, holds, strict=True) if h)
        k = sum(holds)
        return {
            c.id: copy_worth_s(lam_p, t.prefill_s + t.reload_s, holders_wait, t.queue_s, k)
            for c, t, h in zip(cands, terms, holds, strict=True)
            if not h
        }

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        """Counts the request's demand for the prefix it shared (the key found when it was scored)."""
        keyed = self._keyed
        self.demand.note(keyed[1] if keyed is not None and keyed[0] is req else prefix_key(req, ())[0])
