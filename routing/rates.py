"""Online learning of the rates behind predicted TTFT, per replica, from request outcomes.

The cost policy predicts ``ttft = overhead + queue + uncached / prefill_rate + reloaded / host_rate``.
Each finished request gives one equation with the observed ``ttft_s``; its ``Prediction`` (made for the
replica that served it, also after a retry) gives the queue that was assumed and the GPU / host tokens
that were expected, and the reported ``cached_tokens`` gives the actual uncached count
``u = prompt_tokens - cached``. The reloaded part is the cached tokens beyond
the predicted GPU run, ``r = clamp(cached - gpu_pred, 0, host_pred + storage_pred)``. Then:

- work = ttft - overhead - queue; if the prefill term dominates (u / prefill >= r / host) the sample is
  ``prefill = u / (work - r / host)``, otherwise ``host = r / (work - u / prefill)``;
- small requests (u and r both under ``MIN_SAMPLE_TOKENS``) teach the overhead instead:
  ``overhead = ttft - queue - u / prefill``;
- a sample teaches nothing when the predicted queue exceeds the term it would teach (the larger of
  ``u / prefill`` and ``r / host``, or the overhead): the queue is a prediction too, and its error is of
  its own order, so behind a long queue that error would be learned as the term. A host reload is tens
  of times faster than a recompute: learned behind queues, the reload rate absorbed every queueing
  error and read 25-100x too slow (a reload priced like a cold prefill);
- the first ``WARMUP`` (5) samples of each estimate are averaged (the configured start is only a guess
  for some GPU, so data outweighs it at once); after that a **robust EWMA**: a sample is first clipped
  to [0.5x, 2x] of the current value (one outlier moves the estimate by at most ``ALPHA``), then
  ``value += ALPHA (sample - value)``; always bounded to [0.02x, 50x]
  of the configured start (the start is a guess for one GPU: an H200's engine prefills 10x what a
  consumer card does, and a time-scaled emulator faster still).

Each replica's estimates are shrunk toward the fleet's pooled ones until it has served enough requests
(``RateBook``). Until the host rate has samples of its own it follows the prefill rate at its configured
ratio (a reload is ~30x faster than a recompute on the seeds' GPUs, whatever the absolute speed), and the
storage rate always does (L3 prefetches are not timed apart). Decode speed (seconds per generated
token, for the slot-wait term) is learned from streamed answers: ``decode_s / completion_tokens`` (time
from the first byte to the end over the tokens generated; answers of fewer than ``MIN_DECODE_TOKENS``
are skipped). Tokens per byte are learned
elsewhere, once (``routing.tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from routing.config import RoutingConfig
from routing.types import Prediction, ReplicaId, Report, RoutingRequest

ALPHA = 0.2
MIN_SAMPLE_TOKENS = 256
MIN_DECODE_TOKENS = 8
WARMUP = 5  # samples averaged before the EWMA takes over
PRIOR_SAMPLES = 20  # weight of the fleet's pooled estimate in a replica's, in samples
LOW, HIGH = 0.02, 50.0  # bounds relative to the configured start


Row = tuple[float, float, float, float, float, int]  # prefill, host, storage, overhead, decode, samples


@dataclass(frozen=True, slots=True)
class SharedRates:
    """One gateway's own estimates, as shared with the others (``proxy/sync/state_sync.py``)."""

    fleet: Row
    replicas: dict[ReplicaId, Row]


@dataclass(slots=True)
class ReplicaRates:
    """The current estimates for one replica (tokens per second, seconds)."""

    prefill_tokens_per_s: float
    host_tokens_per_s: float
    storage_tokens_per_s: float
    overhead_s: float
    decode_s_per_token: float
    samples: int = 0
    seen: dict[str, int] = field(default_factory=dict)  # samples per estimate, for the warm-up

    def step(self, name: str, value: float, sample: float, start: float) -> float:
        """The estimate ``name`` after one more sample (``learned``), counting it."""
        n = self.seen[name] = self.seen.get(name, 0) + 1
        return learned(value, sample, start, n)


def robust_update(value: float, sample: float, start: float, alpha: float = ALPHA) -> float:
    """One robust EWMA step (see the module docstring)."""
    clipped = min(max(sample, 0.5 * value), 2.0 * value)
    updated = value + alpha * (clipped - value)
    return min(max(updated, LOW * start), HIGH * start)


def learned(value: float, sample: float, start: float, n: int) -> float:
    """The n-th sample's update: the first ``WARMUP`` samples are averaged without clipping (the start
    is only a guess for some GPU), later ones are robust EWMA steps; always within the bounds."""
    if n <= WARMUP:
        return min(max(value + (sample - value) / n, LOW * start), HIGH * start)
    return robust_update(value, sample, start)


class RateBook:
    """Learned rates per replica, shrunk toward the fleet's pooled estimate.

    Every outcome updates both the replica's own estimates and the fleet's pooled ones. ``get`` blends
    them with weight ``n / (n + PRIOR_SAMPLES)`` on the replica's own (n = its samples; rates are
    blended as seconds per token): a replica that has served little looks like the fleet, so one that
    happened to be sampled first does not look faster than its unsampled twins and attract every miss.
    The fixed overhead is the fleet's pooled value for every replica: its per-replica differences are
    mostly noise, and noise of a few milliseconds would otherwise decide every near-tie between idle
    replicas in favour of whichever looked fastest.
    """

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._own: dict[ReplicaId, ReplicaRates] = {}
        self._fleet = self._start()
        self._views: dict[ReplicaId, ReplicaRates] = {}
        self._peers: list[SharedRates] = []  # other gateways' own estimates (``adopt``)

    def _start(self) -> ReplicaRates:
        cfg = self._cfg
        return ReplicaRates(
            cfg.prefill_tokens_per_s,
            cfg.host_load_tokens_per_s,
            cfg.storage_load_tokens_per_s,
            cfg.overhead_s,
            cfg.decode_s_per_token,
        )

    @property
    def fleet(self) -> ReplicaRates:
        return self._fleet

    def own(self, replica: ReplicaId) -> ReplicaRates | None:
        """The replica's own estimates (None before its first outcome)."""
        return self._own.get(replica)

    def get(self, replica: ReplicaId) -> ReplicaRates:
        """The estimates the cost model uses for ``replica`` (a cached blend, see the class docstring)."""
        view = self._views.get(replica)
        if view is None:
            view = self._blend(self._pooled(replica) if self._peers else self._own.get(replica))
            self._views[replica] = view
        return view

    # ---- other gateways' estimates ----------------------------------------------------------------------
    def export(self) -> SharedRates:
        """What this gateway learned itself (never what it adopted), for the other gateways."""
        return SharedRates(_row(self._fleet), {r: _row(v) for r, v in self._own.items() if v.samples})

    def adopt(self, peers: Sequence[SharedRates]) -> None:
        """The other gateways' latest exports: ``get`` pools them with this gateway's own estimates,
        weighted by samples (rates as seconds per token), before the shrink toward the fleet."""
        self._peers = list(peers)
        self._views.clear()

    def _pooled(self, replica: ReplicaId) -> ReplicaRates | None:
        rows = [_row(v) for v in (self._own.get(replica),) if v is not None]
        rows += [p.replicas[replica] for p in self._peers if replica in p.replicas]
        return _pool(rows) if rows else None

    def _pooled_fleet(self) -> ReplicaRates:
        if not self._peers:
            return self._fleet
        return _pool([_row(self._fleet), *(p.fleet for p in self._peers)]) or self._fleet

    def _blend(self, own: ReplicaRates | None) -> ReplicaRates:
        fleet = self._pooled_fleet()
        if own is None or own.samples == 0:
            return fleet
        w = own.samples / (own.samples + PRIOR_SAMPLES)

        def rate(a: float, b: float) -> float:
            return 1.0 / (w / a + (1.0 - w) / b)

        return ReplicaRates(
            rate(own.prefill_tokens_per_s, fleet.prefill_tokens_per_s),
            rate(own.host_tokens_per_s, fleet.host_tokens_per_s),
            rate(own.storage_tokens_per_s, fleet.storage_tokens_per_s),
            fleet.overhead_s,
            w * own.decode_s_per_token + (1.0 - w) * fleet.decode_s_per_token,
            own.samples,
        )

    def forget(self, replica: ReplicaId) -> None:
        self._own.pop(replica, None)
        self._views.pop(replica, None)

    def observe(self, req: RoutingRequest, pred: Prediction, report: Report) -> None:
        """Learns from one finished request (no-op without TTFT or a successful answer)."""
        if not report.ok or report.ttft_s is None or report.ttft_s <= 0:
            return
        own = self._own.get(pred.replica)
        if own is None:
            own = self._own[pred.replica] = self._start()
        for rates in (own, self._fleet):
            self._learn_decode(rates, report)
            self._learn_rates(rates, req, pred, report)
        self._views.clear()

    def _follow_prefill(self, rates: ReplicaRates) -> None:
        """Until their own samples arrive, the reload rates keep their configured ratio to the prefill
        rate: how much faster a reload is than a recompute depends less on the GPU than either does."""
        cfg = self._cfg
        scale = rates.prefill_tokens_per_s / cfg.prefill_tokens_per_s
        if "host" not in rates.seen:
            rates.host_tokens_per_s = cfg.host_load_tokens_per_s * scale
        rates.storage_tokens_per_s = cfg.storage_load_tokens_per_s * scale

    def _learn_decode(self, rates: ReplicaRates, report: Report) -> None:
        tokens, seconds = report.completion_tokens, report.decode_s
        if tokens is None or seconds is None or tokens < MIN_DECODE_TOKENS or seconds <= 0:
            return
        start = self._cfg.decode_s_per_token
        rates.decode_s_per_token = rates.step("decode", rates.decode_s_per_token, seconds / tokens, start)

    def _learn_rates(
        self, rates: ReplicaRates, req: RoutingRequest, pred: Prediction, report: Report
    ) -> None:
        cfg, m, ttft = self._cfg, pred.match, report.ttft_s or 0.0
        queue_s = pred.terms.queue_s
        prompt = float(report.prompt_tokens or req.prompt_tokens)
        reload_pred = m.host_tokens + m.storage_tokens
        cached = float(report.cached_tokens) if report.cached_tokens is not None else m.total_tokens
        uncached = max(0.0, prompt - cached)
        reloaded = min(max(cached - m.gpu_tokens, 0.0), reload_pred)
        work = ttft - rates.overhead_s - queue_s
        prefill_s = uncached / rates.prefill_tokens_per_s
        reload_s = reloaded / rates.host_tokens_per_s
        rates.samples += 1
        if queue_s > max(prefill_s, reload_s, rates.overhead_s):
            return  # the queue's error would swamp the term (module docstring)
        if uncached < MIN_SAMPLE_TOKENS and reloaded < MIN_SAMPLE_TOKENS:
            sample = ttft - queue_s - prefill_s - reload_s
            start = max(cfg.overhead_s, 0.01)
            rates.overhead_s = rates.step("overhead", rates.overhead_s, max(sample, 0.0), start)
        elif prefill_s >= reload_s and work - reload_s > 0:
            sample = uncached / (work - reload_s)
            rates.prefill_tokens_per_s = rates.step(
                "prefill", rates.prefill_tokens_per_s, sample, cfg.prefill_tokens_per_s
            )
            self._follow_prefill(rates)
        elif reload_s > prefill_s and work - prefill_s > 0:
            sample = reloaded / (work - prefill_s)
            rates.host_tokens_per_s = rates.step(
                "host", rates.host_tokens_per_s, sample, cfg.host_load_tokens_per_s
            )


def _row(r: ReplicaRates) -> Row:
    return (
        r.prefill_tokens_per_s,
        r.host_tokens_per_s,
        r.storage_tokens_per_s,
        r.overhead_s,
        r.decode_s_per_token,
        r.samples,
    )


def _pool(rows: Sequence[Row]) -> ReplicaRates | None:
    """Sample-weighted pool of several gateways' estimates of one replica (None without samples):
    rates averaged as seconds per token, overhead and decode time as seconds."""
    n = sum(r[5] for r in rows)
    if n <= 0:
        return None

    def mean(i: int, inverse: bool) -> float:
        total = sum(r[5] * (1.0 / r[i] if inverse else r[i]) for r in rows) / n
        return 1.0 / total if inverse else total

    return ReplicaRates(mean(0, True), mean(1, True), mean(2, True), mean(3, False), mean(4, False), n)
