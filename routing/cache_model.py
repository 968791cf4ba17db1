"""The per-replica cache model: what each replica holds, per tier, as routing believes it.

``CacheModel`` keeps one ``routing.tiers.ReplicaTiers`` per replica:

- **Capacities** come from the replica snapshots (``gpu_tokens``, ``host_tokens``, ``storage_tokens``) and
  stay in engine tokens: every block weighs the tokens per block of the request that brought it
  (``routing.block_lru.BlockLru``; text and token-id prompts differ), scaled by the replica's
  effective-capacity factors (``routing.calibration``) and, when the fleet's total exceeds
  ``model_budget_blocks`` (converted to tokens at the estimator's tokens per block), scaled down together
  so the model never holds more than the budget. ``sync`` adds replicas and notices restarts (a change
  of ``started_at`` forgets GPU and host); a hybrid model with a write-through policy gets no host or
  storage tier (the seeds' trap: its host copies lack the recurrent-state anchor and are never reused,
  contract §3.2).
- ``match`` returns, per replica, the leading tokens found on GPU, then host, then storage, as the
  engine would reuse them (``routing.prefix_reuse``: SGLang's load-back and prefetch thresholds, one
  token always computed, hybrid replicas cut back to a resume point).
- ``record`` inserts the request's blocks optimistically on the chosen replica and returns a
  ``Recorded`` receipt: the prediction and which blocks the request holds provisionally
  (``routing.ledger``). ``settle`` takes the receipt back with the replica's ``Report``: a request that
  never ran is rolled back (the blocks nobody else holds leave the tiers), one that ran is confirmed and
  its reported ``cached_tokens`` calibrates the replica (``routing.calibration``), with a tolerance of two
  blocks or 10% of the prediction, and on hybrid replicas up to one resume interval (resume points off
  the grid, ``routing.resume``).

A replica's blocks live only in its own tiers, so ``forget`` is O(its blocks).

**Exact mode** (``routing.exact``): ``apply_kv_events`` feeds a replica's KV events; from its first batch
on the replica's event-backed keys are the truth on their tiers, a request that ran no longer makes its
blocks real by itself, and reported ``cached_tokens`` only feed the accuracy statistics (capacities are
not rescaled). ``kv_reset`` and ``kv_mode`` complete it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import inf

from routing.calibration import AccuracyStats, Calibration, Sample
from routing.chunk_tail import Tail, next_tail
from routing.config import RoutingConfig
from routing.exact import ExactState, KvMode
from routing.kv_events import EventBatch
from routing.ledger import Provisional, Recorded
from routing.prefix_reuse import resume_limit, reused_prefix
from routing.resume import SequenceEnds
from routing.tiers import ReplicaTiers, host_reusable
from routing.types import BlockHash, PrefixMatch, ReplicaId, ReplicaState, Report, RoutingRequest


@dataclass(slots=True)
class _Replica:
    state: ReplicaState
    tiers: ReplicaTiers
    ends: SequenceEnds  # hybrid: where recorded prompts ended (routing.resume)
    exact: ExactState | None = None  # set by the first KV-event batch (routing.exact)
    tail: Tail | None = None  # the last request routed here (routing.chunk_tail)


class CacheModel:
    """Per-replica tiered cache model (see the module docstring)."""

    def __init__(self, cfg: RoutingConfig, block_tokens: float) -> None:
        self._cfg = cfg
        self._replicas: dict[ReplicaId, _Replica] = {}
        self._provisional = Provisional()
        self.calibration = Calibration()
        self.block_tokens = block_tokens  # engine tokens per block the capacities were sized with
        self._scale = 1.0

    # ---- fleet state -------------------------------------------------------------------------------
    def sync(self, replicas: Sequence[ReplicaState]) -> None:
        """Adds, resizes and restarts replicas from a fleet snapshot."""
        changed = False
        for state in replicas:
            changed |= self._sync_one(state)
        if changed:
            self._resize()

    def resize(self, block_tokens: float) -> None:
        """The token estimate moved: capacities (engine tokens) convert to another number of blocks."""
        self.block_tokens = block_tokens
        self._resize()

    def forget(self, replica: ReplicaId) -> None:
        self._replicas.pop(replica, None)
        self._provisional.forget(replica)
        self.calibration.forget(replica)
        self._resize()

    def restart(self, replica: ReplicaId) -> None:
        """GPU and host are gone (a process restart, a cache flush); storage (L3) survives."""
        r = self._replicas.get(replica)
        if r is not None:
            r.tiers.restart()
            r.ends.clear()
            r.tail = None
            if r.exact is not None:
                r.exact.clear(r.tiers)
        self._provisional.drop(replica)

    # ---- exact mode (routing.exact) -------------------------------------------------------------------
    def apply_kv_events(self, replica: ReplicaId, batch: EventBatch, model: str) -> bool:
        """One KV-event batch of ``replica`` (serving ``model``); False when the replica is not known."""
        r = self._replicas.get(replica)
        if r is None:
            return False
        ex = r.exact
        if ex is None:
            ex = r.exact = ExactState.for_replica(r.state, self._cfg, model, self._provisional.held(replica))
        ex.apply(r.tiers, batch, lambda keys: self._provisional.confirm(replica, keys))
        ex.expire(r.tiers, lambda key: self._provisional.holds(replica, key))
        return True

    def kv_reset(self, replica: ReplicaId, reason: str) -> None:
        """GPU and host are believed empty and the page index forgotten (see ``Router.kv_reset``)."""
        r = self._replicas.get(replica)
        if r is not None and r.exact is not None:
            r.exact.reset(r.tiers, reason)
            r.ends.clear()
            self._provisional.drop(replica)

    def kv_mode(self, replica: ReplicaId) -> KvMode:
        r = self._replicas.get(replica)
        if r is None or r.exact is None:
            return KvMode("learned", "no KV events")
        return r.exact.mode()

    def blocks(self) -> int:
        """Blocks held over all replicas and tiers (bounded by ``model_budget_blocks``)."""
        return sum(r.tiers.blocks() for r in self._replicas.values())

    def replica_ids(self) -> list[ReplicaId]:
        return list(self._replicas)

    def tiers(self, replica: ReplicaId) -> ReplicaTiers | None:
        r = self._replicas.get(replica)
        return r.tiers if r else None

    def accuracy(self) -> Mapping[ReplicaId, AccuracyStats]:
        return self.calibration.accuracy()

    def _sync_one(self, state: ReplicaState) -> bool:
        known = self._replicas.get(state.id)
        if known is None:
            self._replicas[state.id] = _Replica(state, ReplicaTiers(), SequenceEnds())
            return True
        old, known.state = known.state, state  # load figures change on every snapshot; they are not ours
        if old.started_at != state.started_at and old.started_at and state.started_at:
            self.restart(state.id)
        return not _same_shape(old, state)

    def _resize(self) -> None:
        """Tier capacities in engine tokens; the memory budget (blocks) converts to tokens at the
        current tokens-per-block estimate."""
        raw = {rid: _raw_capacity(r.state) for rid, r in self._replicas.items()}
        total = sum(g + h + s for g, h, s in raw.values())
        budget = self._cfg.model_budget_blocks * self.block_tokens
        self._scale = min(1.0, budget / total) if total else 1.0
        for rid, r in self._replicas.items():
            g, h, s = raw[rid]
            gf, hf = self.calibration.factors(rid)
            sc = self._scale
            r.tiers.configure(int(g * gf * sc), int(h * hf * sc), int(s * sc), r.state.write_policy)
            t = r.tiers
            r.ends.capacity = int((t.gpu.capacity + t.host.capacity + t.storage.capacity) / self.block_tokens)

    # ---- requests -----------------------------------------------------------------------------------
    def match(self, req: RoutingRequest, replicas: Sequence[ReplicaState]) -> dict[ReplicaId, PrefixMatch]:
        """Per replica of ``replicas`` (already synced), the request's leading tokens per tier."""
        hashes = req.block_hashes
        out: dict[ReplicaId, PrefixMatch] = {}
        if not hashes:
            return out
        known, reverse = self._replicas, hashes[::-1]
        for state in replicas:
            r = known.get(state.id)
            if r is None:
                continue
            g, h, s = r.tiers.runs(hashes, reverse)
            if g or h or s:
                out[state.id] = reused_prefix(req, g, h, s, self._limit(r, req, g + h + s))
        return out

    def _limit(self, r: _Replica, req: RoutingRequest, n: int) -> float:
        """Tokens of ``n`` leading blocks the engine can resume from: a hybrid replica's resume point,
        and what the requests in the replica's last queued step have not inserted yet
        (``routing.chunk_tail``)."""
        return min(resume_limit(req, r.state, r.ends, n), self._tail_limit(r, req))

    def _tail_limit(self, r: _Replica, req: RoutingRequest) -> float:
        rid, provisional = r.state.id, self._provisional
        return inf if r.tail is None else r.tail.limit(req, r.state, lambda b: provisional.holds(rid, b))

    def record(self, req: RoutingRequest, replica: ReplicaId, prefill_s: float = 0.0) -> Recorded | None:
        """Inserts the request's blocks on ``replica`` (``prefill_s``: its predicted prefill there); the
        receipt goes back to ``settle``."""
        r = self._replicas.get(replica)
        hashes = req.block_hashes
        if r is None or not hashes:
            return None
        g, h, s = r.tiers.runs(hashes)
        resume = resume_limit(req, r.state, r.ends, g + h + s)
        m = reused_prefix(req, g, h, s, min(resume, self._tail_limit(r, req)))
        reach = reused_prefix(req, g, h, s, resume).total_tokens
        r.tail = next_tail(r.tail, req, r.state, m.total_tokens, reach, prefill_s)
        held_from = self._provisional.first_held(replica, hashes[: g + h + s])
        self._provisional.hold(replica, hashes[held_from:])  # before the insert: exact mode keeps them
        r.tiers.insert(hashes, req.block_tokens, (g, h, s))
        new_end = False
        if r.state.resume_interval > 0 and r.state.resume_at_end:
            new_end = r.ends.add(hashes, req.prompt_tokens, req.block_tokens)
        confirmed = min(m.total_tokens, held_from * req.block_tokens)
        return Recorded(req, replica, m, confirmed, held_from, new_end)

    def settle(self, rec: Recorded, report: Report) -> list[BlockHash]:
        """The request's outcome: roll back what never ran (returns the blocks that left), confirm and
        learn from what did."""
        if not report.ran:
            return self._rollback(rec)
        held = rec.request.block_hashes[rec.held_from :]
        self._provisional.confirm(rec.replica, held)
        r = self._replicas.get(rec.replica)
        if r is None:
            return []
        exact = r.exact is not None and r.exact.exact
        if exact and r.exact is not None and r.exact.speaks_for(rec.request):
            r.exact.wait_for(held)
        sample = self._sample(r, rec, report) if report.ok and report.cached_tokens is not None else None
        if sample is not None and self.calibration.learn(rec.replica, sample, adjust=not exact):
            self._resize()
        return []

    def _sample(self, r: _Replica, rec: Recorded, report: Report) -> Sample:
        req, m = rec.request, rec.match
        gpu, host = m.gpu_tokens, m.host_tokens + m.storage_tokens
        tolerance = max(2.0 * req.block_tokens, 0.1 * (gpu + host), float(r.state.resume_interval))
        prompt = float(report.prompt_tokens or req.prompt_tokens)
        return Sample(gpu, host, rec.confirmed, float(report.cached_tokens or 0), prompt, tolerance)

    def _rollback(self, rec: Recorded) -> list[BlockHash]:
        """Undoes the optimistic insert of a request that never ran: the blocks it alone held leave."""
        gone = self._provisional.release(rec.replica, rec.request.block_hashes[rec.held_from :])
        r = self._replicas.get(rec.replica)
        if r is None:
            return []
        r.tiers.discard(gone)
        if rec.new_end:
            r.ends.discard(rec.request.block_hashes[-1])
        return gone

    # ---- what other gateways saw ----------------------------------------------------------------------
    def insert_seen(self, req: RoutingRequest, replica: ReplicaId) -> bool:
        """Another gateway recorded ``req`` on ``replica``: its blocks enter the tiers (not provisional:
        that gateway reports a rollback itself); False when the replica is not known here yet."""
        r = self._replicas.get(replica)
        if r is None or not req.block_hashes:
            return r is not None
        r.tiers.insert(req.block_hashes, req.block_tokens)
        if r.state.resume_interval > 0 and r.state.resume_at_end:
            r.ends.add(req.block_hashes, req.prompt_tokens, req.block_tokens)
        return True

    def discard_seen(self, replica: ReplicaId, blocks: Sequence[BlockHash]) -> None:
        r = self._replicas.get(replica)
        if r is not None:
            r.tiers.discard(blocks)


def _raw_capacity(state: ReplicaState) -> tuple[float, float, float]:
    """GPU, host and storage tokens the model may hold for ``state`` (no reusable host tier: 0, 0)."""
    reusable = host_reusable(state)
    host = state.host_tokens if reusable else 0
    storage = state.storage_tokens if reusable else 0
    return float(state.gpu_tokens), float(host), float(storage)


def _same_shape(a: ReplicaState, b: ReplicaState) -> bool:
    """Same tier sizes and policy (else the tiers are resized); checked on every snapshot, so field by
    field and short-circuiting rather than by building tuples."""
    return (
        a.gpu_tokens == b.gpu_tokens
        and a.host_tokens == b.host_tokens
        and a.storage_tokens == b.storage_tokens
        and a.write_policy == b.write_policy
        and a.hybrid == b.hybrid
    )
