"""The decode server of a prefill/decode pair: chosen by its load and the KV transfer, never by cache.

A decode server keeps no prefix cache (SGLang <= 0.5.10 forces a chunk cache on it, pd-contract.md §2.1):
the prefill sends it the whole prompt's KV, so what it holds of a prompt does not matter, as in Dynamo
and llm-d (§4). The prefill server is chosen apart, by the prefix- and tier-aware cost model
(``routing.router.Router`` over the prefill servers' snapshot).

For a request of P estimated prompt tokens and an output budget N (its ``max_new_tokens``, else
``default_new_tokens``), every healthy decode server d that is not draining costs, in seconds:

    need_d     = P + decode_reserved_tokens
    wait_d     = max(slot_wait_s(d), memory_wait_s(d, need_d))
    transfer_d = (pending_d + P) x kv_bytes_per_token / (kv_transfer_gb_s x 1e9)
    decode_d   = N x decode_s_per_token x (1 + decode_batch_slowdown x running_d)
    cost_d     = wait_d + transfer_d + decode_d

- ``need_d``: the KV the decode server pre-allocates before it admits the request: its whole prompt (the
  prefill sends all of it) and ``--num-reserved-decode-tokens`` (512; pd-contract.md §2.3);
- ``wait_d``: until d admits it: a free running slot past ``max_running_requests``, or device memory
  for ``need_d`` beside the KV its requests in flight hold (``routing.ttft``: ``slot_wait_s``,
  ``memory_wait_s``). The prefill holds the request until the decode has admitted it (§2.3), so this
  wait is in the client's time to first token;
- ``transfer_d``: the prompt's KV over d's link, behind the KV of the requests routed to d that has not
  arrived yet (``pending_d``: their prompt tokens, the decode's ``inflight_prefill_tokens``);
- ``decode_d``: streaming the answer in the batch d runs (``running_d``: its requests in flight), one
  token per ``decode_s_per_token`` at batch 1, slowed by ``decode_batch_slowdown`` per sequence beside it.

Every term is in [0, inf), O(1) per server (O(decoding) when its slots or memory are full). The lowest cost
wins; costs within ``tie_rel_tol`` (relative) or ``tie_abs_s`` of it tie, and a seeded draw breaks the tie.
The ranking (chosen first, then by cost) is the order a failed pair's retry takes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.ttft import memory_wait_s, slot_wait_s
from routing.types import ReplicaId, ReplicaState


class DecodeCost(NamedTuple):
    """One decode server's terms for one request (module docstring), in seconds."""

    replica: ReplicaId
    wait_s: float
    transfer_s: float
    decode_s: float

    @property
    def total(self) -> float:
        return self.wait_s + self.transfer_s + self.decode_s


class DecodePlacement:
    """Ranks decode servers for a request (module docstring); the tie-break is seeded."""

    def __init__(self, cfg: RoutingConfig) -> None:
        self.cfg = cfg
        self._rng = random.Random(cfg.seed)

    def cost(self, state: ReplicaState, prompt_tokens: float, max_new_tokens: int | None) -> DecodeCost:
        cfg = self.cfg
        out = max_new_tokens or cfg.default_new_tokens
        spt = cfg.decode_s_per_token
        need = prompt_tokens + cfg.decode_reserved_tokens
        wait = max(
            slot_wait_s(state, spt, cfg.default_new_tokens),
            memory_wait_s(state, need, spt, cfg.default_new_tokens),
        )
        link = cfg.kv_transfer_gb_s * 1e9
        transfer = (state.inflight_prefill_tokens + prompt_tokens) * cfg.kv_bytes_per_token / link
        decode = out * spt * (1.0 + cfg.decode_batch_slowdown * state.inflight_requests)
        return DecodeCost(state.id, wait, transfer, decode)

    def rank(
        self, states: Sequence[ReplicaState], prompt_tokens: float, max_new_tokens: int | None
    ) -> list[DecodeCost]:
        """The usable decode servers, best first; raises ``NoCandidates`` when there is none."""
        usable = [s for s in states if s.healthy and not s.draining]
        if not usable:
            raise NoCandidates("no healthy decode server")
        costs = sorted((self.cost(s, prompt_tokens, max_new_tokens) for s in usable), key=_total)
        best = costs[0].total
        limit = best + max(self.cfg.tie_abs_s, abs(best) * self.cfg.tie_rel_tol)
        ties = [c for c in costs if c.total <= limit]
        chosen = ties[0] if len(ties) == 1 else self._rng.choice(ties)
        return [chosen, *(c for c in costs if c is not chosen)]


def _total(c: DecodeCost) -> float:
    return c.total
