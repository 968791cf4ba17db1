"""The per-replica cache model: what each replica holds, per tier, and how wrong we have been.

``CacheModel`` implements ``routing.pipeline.PrefixIndex`` on top of ``routing.tiers.ReplicaTiers``:

- **Capacities** come from the replica snapshots (``gpu_tokens``, ``host_tokens``, ``storage_tokens``),
  converted to blocks with the current tokens-per-block estimate times the learned ratio of engine
  tokens to estimated tokens (``usage.prompt_tokens`` / the request's estimate, a robust EWMA),
  scaled by a learned per-replica, per-tier *effective-capacity factor* (in (0, 1]) and, when the
  fleet's total exceeds
  ``model_budget_blocks``, scaled down together so the model never holds more than the budget.
  Replicas are synced from every snapshot passed to ``match`` (or ``sync``): a change of
  ``started_at`` is a restart and forgets GPU and host; a hybrid model with a write-through policy
  gets no host or storage tier (the seeds' trap: its host copies lack the recurrent-state anchor and
  are never reused, contract §3.2).
- ``match`` returns, per replica, the leading tokens found on GPU, then host, then storage. Host runs
  shorter than SGLang's load-back threshold (10 tokens) and storage runs shorter than its prefetch
  threshold (256 tokens) count as misses, and the total is capped at ``prompt_tokens - 1`` (the engine
  always computes one token). On a hybrid replica (``resume_interval`` > 0) a match that stops inside a
  recorded prompt is first cut back to the last recurrent-state resume point (``routing.resume``).
- ``record`` inserts the request's blocks optimistically on the chosen replica and remembers what it
  predicted; the blocks it newly added stay *provisional* until the request's outcome arrives. A
  request that failed before its first byte, or was recorded again elsewhere (a retry), never ran:
  its new blocks are rolled back.
- ``observe`` compares the prediction with the reported ``cached_tokens``. Lower than predicted on
  blocks that were not provisional means the model kept blocks the engine had evicted: the factor of
  the tier where the prediction broke shrinks by ``GAIN x missing fraction`` (and the tier evicts down
  to its new size). Higher means the model was pessimistic: both factors grow back toward 1. These
  comparisons convert the reported tokens to estimated ones with the learned ratio, so a wrong
  chars-per-token guess is not mistaken for a capacity error. On hybrid replicas a shortfall of up to one
  resume interval is explained by resume points off the grid (``routing.resume``), not by evictions.
  Every outcome adds |predicted - actual| (in engine tokens) to the replica's accuracy statistics.

A replica's blocks live only in its own tiers, so ``forget`` is O(its blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from math import inf

from routing.config import RoutingConfig
from routing.pipeline import Outcome
from routing.rates import robust_update
from routing.resume import SequenceEnds, grid_tokens
from routing.tiers import CountedBlocks, ReplicaTiers, host_reusable
from routing.types import NO_MATCH, Decision, PrefixMatch, ReplicaId, ReplicaState, RoutingRequest

GAIN = 0.25  # learning gain of the effective-capacity factors
MIN_FACTOR = 0.05
LOAD_BACK_MIN_TOKENS = 10  # SGLang skips (recomputes) host loads shorter than this
PREFETCH_MIN_TOKENS = 256  # SGLang prefetches from storage only from this many tokens
MAX_PENDING = 8192  # predictions awaiting an outcome (in-flight requests); the oldest are dropped beyond


@dataclass(frozen=True, slots=True)
class AccuracyStats:
    """How well the model predicted one replica's reported ``cached_tokens``."""

    requests: int
    mean_abs_error_tokens: float
    error_ratio: float  # sum |predicted - actual| / sum prompt tokens
    mean_predicted_tokens: float
    mean_actual_tokens: float
    gpu_factor: float
    host_factor: float
    abs_error_tokens: float = 0.0  # sum |predicted - actual| (engine tokens), to pool replicas
    prompt_tokens: float = 0.0  # sum of reported prompt tokens


@dataclass(slots=True)
class _Accuracy:
    requests: int = 0
    abs_error: float = 0.0
    prompt: float = 0.0
    predicted: float = 0.0
    actual: float = 0.0


@dataclass(slots=True)
class _Replica:
    state: ReplicaState
    tiers: ReplicaTiers
    ends: SequenceEnds  # hybrid: where recorded prompts ended (routing.resume)
    gpu_factor: float = 1.0
    host_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class _Pending:
    request: RoutingRequest
    replica: ReplicaId
    gpu: float  # predicted tokens per tier
    host: float
    confirmed: float  # predicted tokens on blocks that were not provisional
    new_from: int  # first block index this request added
    new_end: bool  # hybrid: this request added its prompt's end to the replica's SequenceEnds


class CacheModel:
    """Per-replica tiered cache model (see the module docstring)."""

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._replicas: dict[ReplicaId, _Replica] = {}
        self._provisional: dict[ReplicaId, CountedBlocks] = {}
        self._pending: dict[int, _Pending] = {}
        self._accuracy: dict[ReplicaId, _Accuracy] = {}
        self._block_tokens = cfg.block_chars / cfg.chars_per_token
        self._engine_ratio = 1.0  # engine tokens per estimated token, learned from usage.prompt_tokens
        self._sized_ratio = 1.0  # the ratio the capacities were last computed with
        self._scale = 1.0

    # ---- fleet state -------------------------------------------------------------------------------
    def sync(self, replicas: Sequence[ReplicaState]) -> None:
        """Adds, resizes and restarts replicas from a fleet snapshot."""
        changed = False
        for state in replicas:
            changed |= self._sync_one(state)
        if changed:
            self._resize()

    def forget(self, replica: ReplicaId) -> None:
        self._replicas.pop(replica, None)
        self._provisional.pop(replica, None)
        self._resize()

    def restart(self, replica: ReplicaId) -> None:
        """GPU and host are gone (a process restart, a cache flush); storage (L3) survives."""
        r = self._replicas.get(replica)
        if r is not None:
            r.tiers.restart()
            r.ends.clear()
        self._provisional.pop(replica, None)

    def blocks(self) -> int:
        """Blocks held over all replicas and tiers (bounded by ``model_budget_blocks``)."""
        return sum(r.tiers.blocks() for r in self._replicas.values())

    def tiers(self, replica: ReplicaId) -> ReplicaTiers | None:
        r = self._replicas.get(replica)
        return r.tiers if r else None

    def _sync_one(self, state: ReplicaState) -> bool:
        known = self._replicas.get(state.id)
        if known is None:
            self._replicas[state.id] = _Replica(state, ReplicaTiers(), SequenceEnds())
            return True
        if known.state == state:
            return False
        if known.state.started_at and state.started_at and known.state.started_at != state.started_at:
            self.restart(state.id)
        old = known.state
        known.state = state
        return _sizing(old) != _sizing(state)

    def _resize(self) -> None:
        self._sized_ratio = self._engine_ratio
        raw = {rid: self._raw_capacity(r.state) for rid, r in self._replicas.items()}
        total = sum(g + h + s for g, h, s in raw.values())
        self._scale = min(1.0, self._cfg.model_budget_blocks / total) if total else 1.0
        for rid, r in self._replicas.items():
            g, h, s = raw[rid]
            r.tiers.configure(
                int(g * r.gpu_factor * self._scale),
                int(h * r.host_factor * self._scale),
                int(s * self._scale),
                r.state.write_policy,
            )
            t = r.tiers
            r.ends.capacity = t.gpu.capacity + t.host.capacity + t.storage.capacity

    def _raw_capacity(self, state: ReplicaState) -> tuple[float, float, float]:
        bt = self._block_tokens * self._engine_ratio  # engine tokens per block
        reusable = host_reusable(state)
        host = state.host_tokens / bt if reusable else 0.0
        storage = state.storage_tokens / bt if reusable else 0.0
        return state.gpu_tokens / bt, host, storage

    # ---- PrefixIndex --------------------------------------------------------------------------------
    def match(self, req: RoutingRequest, replicas: Sequence[ReplicaState]) -> Mapping[ReplicaId, PrefixMatch]:
        self.sync(replicas)
        hashes = req.block_hashes
        out: dict[ReplicaId, PrefixMatch] = {}
        if not hashes:
            return out
        for state in replicas:
            r = self._replicas[state.id]
            g, h, s = r.tiers.runs(hashes)
            out[state.id] = self._to_tokens(req, g, h, s, self._resume_limit(req, r, g + h + s))
        return out

    def record(self, req: RoutingRequest, decision: Decision) -> None:
        r = self._replicas.get(decision.replica)
        if r is None or not req.block_hashes:
            return
        self._track_block_tokens(req.block_tokens)
        previous = self._pending.pop(id(req), None)
        if previous is not None:  # recorded again (a retry on another replica): the first never ran
            self._rollback(previous)
        hashes = req.block_hashes
        g, h, s = r.tiers.insert(hashes)
        m = self._to_tokens(req, g, h, s, self._resume_limit(req, r, g + h + s))
        new_end = False
        if r.state.resume_interval > 0 and r.state.resume_at_end:
            new_end = r.ends.add(hashes, req.prompt_tokens, req.block_tokens)
        provisional = self._provisional.setdefault(decision.replica, CountedBlocks())
        confirmed = provisional.first_of(hashes[: g + h + s])
        provisional.add(hashes[g + h + s :])
        pending = _Pending(
            req,
            decision.replica,
            m.gpu_tokens,
            m.host_tokens + m.storage_tokens,
            min(m.total_tokens, confirmed * req.block_tokens),
            g + h + s,
            new_end,
        )
        self._pending[id(req)] = pending
        if len(self._pending) > MAX_PENDING:
            for key in list(islice(self._pending, len(self._pending) - MAX_PENDING)):
                self._release(self._pending.pop(key))

    def observe(self, outcome: Outcome) -> None:
        p = self._pending.get(id(outcome.request))
        if p is None or p.request is not outcome.request:
            return
        del self._pending[id(outcome.request)]
        if not outcome.ok and outcome.ttft_s is None:  # failed before its first byte: it never ran
            self._rollback(p)
            return
        self._release(p)
        r = self._replicas.get(p.replica)
        if (
            r is None
            or not outcome.ok
            or outcome.cached_tokens is None
            or outcome.decision.replica != p.replica
        ):
            return
        self._learn_engine_ratio(p.request.prompt_tokens, outcome.prompt_tokens)
        ratio = self._engine_ratio
        actual = float(outcome.cached_tokens)
        self._account(p, actual, float(outcome.prompt_tokens or p.request.prompt_tokens * ratio), ratio)
        resume_slack = r.state.resume_interval / ratio  # hybrid: resume points off the grid
        tolerance = max(2.0 * p.request.block_tokens, 0.1 * (p.gpu + p.host), resume_slack)
        resized = self._learn(r, p, actual / ratio, tolerance)
        if resized or abs(ratio - self._sized_ratio) > 0.1 * self._sized_ratio:
            self._resize()

    def accuracy(self) -> Mapping[ReplicaId, AccuracyStats]:
        out: dict[ReplicaId, AccuracyStats] = {}
        for rid, a in self._accuracy.items():
            r = self._replicas.get(rid)
            n = max(1, a.requests)
            out[rid] = AccuracyStats(
                requests=a.requests,
                mean_abs_error_tokens=a.abs_error / n,
                error_ratio=a.abs_error / a.prompt if a.prompt else 0.0,
                mean_predicted_tokens=a.predicted / n,
                mean_actual_tokens=a.actual / n,
                gpu_factor=r.gpu_factor if r else 1.0,
                host_factor=r.host_factor if r else 1.0,
                abs_error_tokens=a.abs_error,
                prompt_tokens=a.prompt,
            )
        return out

    # ---- internals ----------------------------------------------------------------------------------
    def _resume_limit(self, req: RoutingRequest, r: _Replica, n: int) -> float:
        """Estimated tokens a hybrid replica can resume from when ``n`` leading blocks match (see
        ``routing.resume``); ``inf`` when the match is whole or the replica is not hybrid."""
        interval = r.state.resume_interval
        if interval <= 0 or n <= 0:
            return inf
        bt = req.block_tokens
        if r.state.resume_at_end and r.ends.contained(req.block_hashes[n - 1], req.prompt_tokens, bt):
            return inf
        ratio = self._engine_ratio
        return grid_tokens(n * bt * ratio, interval) / ratio

    def _to_tokens(self, req: RoutingRequest, g: int, h: int, s: int, resume: float = inf) -> PrefixMatch:
        if not g and not h and not s:
            return NO_MATCH
        bt = req.block_tokens
        gpu, host, storage = g * bt, h * bt, s * bt
        if resume < gpu + host + storage:  # a hybrid replica resumes only at a resume point
            gpu = min(gpu, resume)
            host = min(host, resume - gpu)
            storage = min(storage, resume - gpu - host)
        if 0 < host < LOAD_BACK_MIN_TOKENS:
            host, storage = 0.0, 0.0
        if storage < PREFETCH_MIN_TOKENS:
            storage = 0.0
        limit = max(0.0, req.prompt_tokens - 1.0)
        gpu = min(gpu, limit)
        host = min(host, limit - gpu)
        storage = min(storage, limit - gpu - host)
        return PrefixMatch(gpu, host, storage)

    def _track_block_tokens(self, block_tokens: float) -> None:
        """Capacities in blocks follow the tokens-per-block estimate when it moves by over 10%."""
        if block_tokens > 0 and abs(block_tokens - self._block_tokens) > 0.1 * self._block_tokens:
            self._block_tokens = block_tokens
            self._resize()

    def _rollback(self, p: _Pending) -> None:
        """Undoes the optimistic insert of a request that never ran: its new blocks leave the tiers."""
        self._release(p)
        r = self._replicas.get(p.replica)
        hashes = p.request.block_hashes
        if r is None:
            return
        r.tiers.discard(hashes[p.new_from :])
        if p.new_end:
            r.ends.discard(hashes[-1])

    def _release(self, p: _Pending) -> None:
        provisional = self._provisional.get(p.replica)
        if provisional is None:
            return
        provisional.remove(p.request.block_hashes[p.new_from :])

    def _learn_engine_ratio(self, estimated: int, reported: int | None) -> None:
        if reported and reported >= 16 and estimated > 0:
            self._engine_ratio = robust_update(self._engine_ratio, reported / estimated, 1.0)

    def _account(self, p: _Pending, actual: float, prompt: float, ratio: float) -> None:
        """Accuracy in the engine's tokens: the prediction converted with the learned ratio."""
        predicted = (p.gpu + p.host) * ratio
        a = self._accuracy.setdefault(p.replica, _Accuracy())
        a.requests += 1
        a.abs_error += abs(predicted - actual)
        a.prompt += prompt
        a.predicted += predicted
        a.actual += actual

    def _learn(self, r: _Replica, p: _Pending, actual: float, tolerance: float) -> bool:
        """Moves the effective-capacity factors; True when they changed."""
        predicted = p.gpu + p.host
        if actual + tolerance < min(predicted, p.confirmed):
            if actual + tolerance < p.gpu:
                missing = (p.gpu - actual) / p.gpu
                r.gpu_factor = max(MIN_FACTOR, r.gpu_factor * (1.0 - GAIN * missing))
            elif p.host > 0:
                missing = min(1.0, (predicted - actual) / p.host)
                r.host_factor = max(MIN_FACTOR, r.host_factor * (1.0 - GAIN * missing))
            return True
        if actual > predicted + tolerance and (r.gpu_factor < 1.0 or r.host_factor < 1.0):
            r.gpu_factor = min(1.0, r.gpu_factor + GAIN * (1.0 - r.gpu_factor))
            r.host_factor = min(1.0, r.host_factor + GAIN * (1.0 - r.host_factor))
            return True
        return False


def _sizing(state: ReplicaState) -> tuple[object, ...]:
    return (state.gpu_tokens, state.host_tokens, state.storage_tokens, state.write_policy, state.hybrid)
