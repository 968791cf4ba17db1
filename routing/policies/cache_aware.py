"""sglang-router 0.3.2's ``cache_aware`` policy, as a baseline in our pipeline (peers.md §2.1).

Per request (``CacheAwareScorer``; ``SeededPicker`` draws among exact ties):

1. **Balance check** on router-local in-flight request counts over healthy replicas: if
   ``max - min > balance_abs_threshold`` (64) AND ``max > balance_rel_threshold x min`` (1.5), the
   fleet is imbalanced: cost(r) = inflight_requests(r), go to the least loaded (Reason BALANCE).
2. Otherwise **match** the request against the policy's own approximate tree of what it routed: the
   longest run of leading blocks any replica was sent. If ``matched / total > cache_threshold`` (0.3),
   cost(r) = 0 for the replicas with that run and 1 + inflight_requests(r) for the others (Reason
   CACHE_MATCH), else cost(r) = inflight_requests(r) (Reason LEAST_LOAD).
3. The request's blocks are inserted for the chosen replica in every case (``chose``).

Like the peer, the tree never learns the engine's evictions, host tiers or restarts (it only ages out
entries per replica beyond ``cache_aware_max_tree_chars``, LRU) and counts requests rather than tokens.
Unlike the peer it matches in blocks of canonical prompt (our hashing) rather than characters of the
joined message text, and ties are broken by a seeded draw rather than worker order (our pipeline's
rule), so the comparison isolates the policy. It does not use the ``CacheModel``'s matches.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.block_lru import BlockLru
from routing.config import RoutingConfig
from routing.pipeline import HealthyFilter, Pipeline, SeededPicker
from routing.protocols import Scored, Stage
from routing.types import Candidate, Reason, ReplicaId, RoutingRequest


class CacheAwareScorer(Stage):
    """cost(r) per the module docstring (requests in flight, or 0 for the best cache match)."""

    name = "cache_aware"

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._trees: dict[ReplicaId, BlockLru] = {}
        self._capacity = max(1, cfg.cache_aware_max_tree_chars // max(1, cfg.block_chars))

    def score(self, req: RoutingRequest, cands: Sequence[Candidate]) -> list[Scored]:
        loads = [c.state.inflight_requests for c in cands]
        lo, hi = min(loads), max(loads)
        cfg = self._cfg
        if hi - lo > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo:
            return [Scored(c, float(n), reason=Reason.BALANCE) for c, n in zip(cands, loads, strict=True)]
        total, reverse = len(req.block_hashes), req.block_hashes[::-1]
        runs = [self._run(c.state.id, reverse) for c in cands]
        if total and max(runs) / total > cfg.cache_threshold:
            best = max(runs)
            return [
                Scored(c, 0.0 if run == best else 1.0 + n, reason=Reason.CACHE_MATCH)
                for c, run, n in zip(cands, runs, loads, strict=True)
            ]
        return [Scored(c, float(n), reason=Reason.LEAST_LOAD) for c, n in zip(cands, loads, strict=True)]

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        tree = self._trees.setdefault(replica, BlockLru(self._capacity))
        tree.touch_all(req.block_hashes[::-1])
        tree.overflow()

    def forget(self, replica: ReplicaId) -> None:
        self._trees.pop(replica, None)

    def restart(self, replica: ReplicaId) -> None:
        """Its cache is gone; like sglang-router we cannot tell, but our tree of it should not stay."""
        self._trees.pop(replica, None)

    def _run(self, replica: ReplicaId, reverse: tuple[int, ...]) -> int:
        tree = self._trees.get(replica)
        return tree.run(reverse, 0) if tree is not None else 0


def cache_aware(cfg: RoutingConfig) -> Pipeline:
    picker = SeededPicker(cfg.seed, abs_tol=0.0)
    return Pipeline("cache_aware", [HealthyFilter()], CacheAwareScorer(cfg), picker, Reason.LEAST_LOAD)
