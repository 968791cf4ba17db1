"""Where a warm-up places a document: spread by free cache capacity, copied only when asked.

A RAG pipeline warms documents before their first question (``POST /v1/warmup``). Each document goes to
``count`` replicas (1 unless the caller asks for more, or "all"). For a document of T tokens, a replica r
that may serve the model is ranked by

    fill(r) = (warmed(r) + T) / reusable(r)        reusable(r) = GPU tokens + reusable host tokens

(``warmed(r)``: tokens of the documents already warmed there and still alive, which the proxy's warm-up
registry knows), lowest first, then by the placement cost of computing the document there
(``routing.placement``: its queue and the delay it would impose on live traffic), then by id. A replica
that already holds the document (at least 90% of it in some tier, per the cache model) is ranked first,
as its warm-up costs almost nothing. So documents fill the fleet's GPU and host pools evenly; beyond
their sum they still go to the least filled replicas (the LRU there drops the oldest warm documents,
which the registry reports as ``cold``). Replicas whose host tier is not reusable (HiCache off, or a
hybrid model under a write-through policy, ``routing.tiers.host_reusable``) count their GPU pool only,
and the warm-up answer says a document warmed there does not survive GPU pressure.

Pure: inputs are snapshots, the output is an order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.placement import imposed_delay_s
from routing.rates import RateBook
from routing.tiers import host_reusable
from routing.types import PrefixMatch, ReplicaId, ReplicaState, RoutingRequest

HELD_FRACTION = 0.9  # a replica holding this much of the document already has it


def reusable_tokens(state: ReplicaState) -> float:
    """GPU tokens plus host tokens that survive GPU pressure (0 host when HiCache cannot reuse them)."""
    return float(state.gpu_tokens + (state.host_tokens if host_reusable(state) else 0))


def rank_for_warmup(
    req: RoutingRequest,
    states: Sequence[ReplicaState],
    matches: Mapping[ReplicaId, PrefixMatch],
    warmed: Mapping[ReplicaId, float],
    rates: RateBook,
    max_utilization: float,
) -> list[ReplicaId]:
    """Healthy, not draining replicas in warm-up order (see the module docstring)."""

    def key(s: ReplicaState) -> tuple[bool, float, float, str]:
        m = matches.get(s.id)
        held = m is not None and m.total_tokens >= HELD_FRACTION * req.prompt_tokens
        fill = (warmed.get(s.id, 0.0) + req.prompt_tokens) / max(reusable_tokens(s), 1.0)
        return (not held, fill, _compute_cost(req, s, rates, max_utilization), s.id)

    usable = [s for s in states if s.healthy and not s.draining]
    return [s.id for s in sorted(usable, key=key)]


def _compute_cost(req: RoutingRequest, s: ReplicaState, rates: RateBook, cap: float) -> float:
    x = req.prompt_tokens / rates.get(s.id).prefill_tokens_per_s
    return (
        s.inflight_prefill_s
        + x
        + imposed_delay_s(x, s.inflight_prefill_s, s.arrival_rate, s.utilization, cap)
    )
