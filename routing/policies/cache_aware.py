"""sglang-router 0.3.2's ``cache_aware`` policy, as a baseline in our pipeline (peers.md §2.1).

Per request:

1. **Balance check** on router-local in-flight request counts over healthy replicas: if
   ``max - min > balance_abs_threshold`` (64) AND ``max > balance_rel_threshold x min`` (1.5), the
   fleet is imbalanced: go to the least-loaded replica (Reason BALANCE).
2. Otherwise **match** the request against the policy's own approximate tree of what it routed: the
   longest run of leading blocks any replica was sent. If ``matched / total > cache_threshold`` (0.3),
   go to that replica (Reason CACHE_MATCH), else to the least-loaded one (Reason LEAST_LOAD).
3. The request's blocks are inserted for the chosen replica in every case.

Like the peer, the tree never learns the engine's evictions, host tiers or restarts (it only ages out
entries per replica beyond ``cache_aware_max_tree_chars``, LRU) and counts requests rather than tokens.
Unlike the peer it matches in blocks of canonical prompt (our hashing) rather than characters of the
joined message text, and ties are broken by a seeded draw rather than worker order (our pipeline's
rule), so the comparison isolates the policy. It does not use the ``CacheModel``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, NoCandidates, Outcome
from routing.tiers import BlockLru
from routing.types import Candidate, Decision, Reason, ReplicaId, RoutingRequest


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._rng = random.Random(cfg.seed)
        self._trees: dict[ReplicaId, BlockLru] = {}
        self._capacity = max(1, cfg.cache_aware_max_tree_chars // max(1, cfg.block_chars))
        self._filter = HealthyFilter()

    def route(self, req: RoutingRequest, cands: Sequence[Candidate]) -> Decision:
        cands = self._filter.filter(req, cands)
        if not cands:
            raise NoCandidates("no healthy replica")
        chosen, reason, ratio = self._choose(req, cands)
        self._insert(chosen.id, req)
        ranked = (
            chosen.id,
            *(c.id for c in sorted(cands, key=lambda c: c.state.inflight_requests) if c is not chosen),
        )
        return Decision(
            replica=chosen.id,
            reason=reason,
            predicted_cost=float(chosen.state.inflight_requests),
            predicted_cached_tokens=ratio * len(req.block_hashes) * req.block_tokens,
            breakdown={"match_ratio": ratio, "inflight_requests": float(chosen.state.inflight_requests)},
            ranked=ranked,
        )

    def observe(self, outcome: Outcome) -> None:
        return None

    def forget(self, replica: ReplicaId) -> None:
        self._trees.pop(replica, None)

    def restart(self, replica: ReplicaId) -> None:
        """Its cache is gone; like sglang-router we cannot tell, but our tree of it should not stay."""
        self._trees.pop(replica, None)

    def _choose(self, req: RoutingRequest, cands: Sequence[Candidate]) -> tuple[Candidate, Reason, float]:
        loads = [c.state.inflight_requests for c in cands]
        lo, hi = min(loads), max(loads)
        cfg = self._cfg
        if hi - lo > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo:
            return self._least_load(cands), Reason.BALANCE, 0.0
        total = len(req.block_hashes)
        if total:
            runs = [(self._run(c.id, req), c) for c in cands]
            best = max(run for run, _ in runs)
            ratio = best / total
            if ratio > cfg.cache_threshold:
                return self._draw([c for run, c in runs if run == best]), Reason.CACHE_MATCH, ratio
        return self._least_load(cands), Reason.LEAST_LOAD, 0.0

    def _run(self, replica: ReplicaId, req: RoutingRequest) -> int:
        tree = self._trees.get(replica)
        return tree.run(req.block_hashes, 0) if tree is not None else 0

    def _least_load(self, cands: Sequence[Candidate]) -> Candidate:
        least = min(c.state.inflight_requests for c in cands)
        return self._draw([c for c in cands if c.state.inflight_requests == least])

    def _draw(self, ties: list[Candidate]) -> Candidate:
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    def _insert(self, replica: ReplicaId, req: RoutingRequest) -> None:
        tree = self._trees.setdefault(replica, BlockLru(self._capacity))
        for block in reversed(req.block_hashes):
            tree.touch(block)
        tree.overflow()
