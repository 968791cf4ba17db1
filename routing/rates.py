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
- **robust EWMA**: a sample is first clipped to [0.5x, 2x] of the current value (one outlier moves the
  estimate by at most ``ALPHA``), then ``value += ALPHA (sample - value)``, then bounded to [0.2x, 5x]
  of the configured start.

Each replica's estimates are shrunk toward the fleet's pooled ones until it has served enough requests
(``RateBook``). Decode speed (seconds per generated token, for the slot-wait term) is learned from
streamed answers: ``decode_s / completion_tokens`` (time from the first byte to the end over the tokens
generated; answers of fewer than ``MIN_DECODE_TOKENS`` are skipped). Tokens per byte are learned
elsewhere, once (``routing.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.config import RoutingConfig
from routing.types import Prediction, ReplicaId, Report, RoutingRequest

ALPHA = 0.2
MIN_SAMPLE_TOKENS = 256
MIN_DECODE_TOKENS = 8
PRIOR_SAMPLES = 20  # weight of the fleet's pooled estimate in a replica's, in samples
LOW, HIGH = 0.2, 5.0  # bounds relative to the configured start


@dataclass(slots=True)
class ReplicaRates:
    """The current estimates for one replica (tokens per second, seconds)."""

    prefill_tokens_per_s: float
    host_tokens_per_s: float
    storage_tokens_per_s: float
    overhead_s: float
    decode_s_per_token: float
    samples: int = 0


def robust_update(value: float, sample: float, start: float, alpha: float = ALPHA) -> float:
    """One robust EWMA step (see the module docstring)."""
    clipped = min(max(sample, 0.5 * value), 2.0 * value)
    updated = value + alpha * (clipped - value)
    return min(max(updated, LOW * start), HIGH * start)


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
            view = self._blend(self._own.get(replica))
            self._views[replica] = view
        return view

    def _blend(self, own: ReplicaRates | None) -> ReplicaRates:
        fleet = self._fleet
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

    def _learn_decode(self, rates: ReplicaRates, report: Report) -> None:
        tokens, seconds = report.completion_tokens, report.decode_s
        if tokens is None or seconds is None or tokens < MIN_DECODE_TOKENS or seconds <= 0:
            return
        start = self._cfg.decode_s_per_token
        rates.decode_s_per_token = robust_update(rates.decode_s_per_token, seconds / tokens, start)

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
        if uncached < MIN_SAMPLE_TOKENS and reloaded < MIN_SAMPLE_TOKENS:
            sample = ttft - queue_s - prefill_s - reload_s
            start = max(cfg.overhead_s, 0.01)
            rates.overhead_s = robust_update(rates.overhead_s, max(sample, 0.0), start)
        elif prefill_s >= reload_s and work - reload_s > 0:
            sample = uncached / (work - reload_s)
            rates.prefill_tokens_per_s = robust_update(
                rates.prefill_tokens_per_s, sample, cfg.prefill_tokens_per_s
            )
        elif reload_s > prefill_s and work - prefill_s > 0:
            sample = reloaded / (work - prefill_s)
            rates.host_tokens_per_s = robust_update(
                rates.host_tokens_per_s, sample, cfg.host_load_tokens_per_s
            )
