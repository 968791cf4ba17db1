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

    cost(r) = ttft(r) + x · λ · (W + x) / (1 - ρ)          (seconds, range [0, inf), O(1) per replica)

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

from routing.protocols import Scored, Stage
from routing.rates import RateBook
from routing.ttft import predict_ttft
from routing.types import Candidate, RoutingRequest


def imposed_delay_s(x: float, wait: float, arrival_rate: float, utilization: float, cap: float) -> float:
    """x · λ · (W + x) / (1 - ρ): the delay a request with own work x imposes on later arrivals."""
    if x <= 0.0 or arrival_rate <= 0.0:
        return 0.0
    rho = min(max(utilization, 0.0), cap)
    return x * arrival_rate * (wait + x) / (1.0 - rho)


class PlacementScorer(Stage):
    """cost(r) = ttft(r) + x · λ · (W + x) / (1 - ρ) (seconds; see the module docstring)."""

    name = "placement"

    def __init__(self, rates: RateBook, default_tokens: int, max_utilization: float) -> None:
        self._rates = rates
        self._default_tokens = default_tokens
        self._cap = max_utilization

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        rates, tokens, cap = self._rates.get, self._default_tokens, self._cap
        out: list[Scored] = []
        append = out.append
        for c in cands:
            t = predict_ttft(req, c, rates(c.state.id), tokens)
            st, x = c.state, t.prefill_s + t.reload_s
            extra = imposed_delay_s(x, t.queue_s, st.arrival_rate, st.utilization, cap)
            append(Scored(c, t.queue_s + x + t.overhead_s + extra, t))
        return out
