"""Online learning of the rates behind predicted TTFT, per replica, from request outcomes.

The cost policy predicts ``ttft = overhead + queue + uncached / prefill_rate + reloaded / host_rate``.
Each outcome gives one equation with the observed ``ttft_s``; the policy's own decision breakdown gives
the queue it assumed and the GPU / host tokens it expected, and the reported ``cached_tokens`` gives
the actual uncached count ``u = prompt_tokens - cached``. The reloaded part is the cached tokens beyond
the predicted GPU run, ``r = clamp(cached - gpu_pred, 0, host_pred + storage_pred)``. Then:

- work = ttft - overhead - queue; if the prefill term dominates (u / prefill >= r / host) the sample is
  ``prefill = u / (work - r / host)``, otherwise ``host = r / (work - u / prefill)``;
- small requests (u and r both under ``MIN_SAMPLE_TOKENS``) teach the overhead instead:
  ``overhead = ttft - queue - u / prefill``;
- **robust EWMA**: a sample is first clipped to [0.5x, 2x] of the current value (one outlier moves the
  estimate by at most ``ALPHA``), then ``value += ALPHA (sample - value)``, then bounded to [0.2x, 5x]
  of the configured start.

Each replica's estimates are shrunk toward the fleet's pooled ones until it has served enough requests
(``RateBook``). The mean service time (for the slot-wait term) is an EWMA of ttft + expected decode
time. Characters per token is learned separately (``CharsPerToken``) from ``usage.prompt_tokens``
against the canonical length; it belongs to the model's tokenizer rather than to a replica, so the
proxy owns one, feeds it every outcome and builds requests with its current value.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.config import RoutingConfig
from routing.pipeline import Outcome
from routing.types import ReplicaId

ALPHA = 0.2
MIN_SAMPLE_TOKENS = 256
PRIOR_SAMPLES = 20  # weight of the fleet's pooled estimate in a replica's, in samples
LOW, HIGH = 0.2, 5.0  # bounds relative to the configured start


@dataclass(slots=True)
class ReplicaRates:
    """The current estimates for one replica (tokens per second, seconds)."""

    prefill_tokens_per_s: float
    host_tokens_per_s: float
    storage_tokens_per_s: float
    overhead_s: float
    service_s: float
    samples: int = 0


def robust_update(value: float, sample: float, start: float) -> float:
    """One robust EWMA step (see the module docstring)."""
    clipped = min(max(sample, 0.5 * value), 2.0 * value)
    updated = value + ALPHA * (clipped - value)
    return min(max(updated, LOW * start), HIGH * start)


class RateBook:
    """Learned rates per replica, shrunk toward the fleet's pooled estimate.

    Every outcome updates both the replica's own estimates and the fleet's pooled ones. ``get`` blends
    them with weight ``n / (n + PRIOR_SAMPLES)`` on the replica's own (n = its samples; rates are
    blended as seconds per token): a replica that has served little looks like the fleet, so one that
    happened to be sampled first does not look faster than its unsampled twins and attract every miss.
    The fixed overhead and the service time are the fleet's pooled values for every replica: their
    per-replica differences are mostly noise, and noise of a few milliseconds would otherwise decide
    every near-tie between idle replicas in favour of whichever looked fastest.
    """

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._own: dict[ReplicaId, ReplicaRates] = {}
        self._fleet = self._start()
        self._views: dict[ReplicaId, ReplicaRates] = {}

    def _start(self) -> ReplicaRates:
        cfg = self._cfg
        service = cfg.overhead_s + cfg.default_new_tokens * cfg.decode_s_per_token
        return ReplicaRates(
            cfg.prefill_tokens_per_s,
            cfg.host_load_tokens_per_s,
            cfg.storage_load_tokens_per_s,
            cfg.overhead_s,
            service,
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
            fleet.service_s,
            own.samples,
        )

    def forget(self, replica: ReplicaId) -> None:
        self._own.pop(replica, None)
        self._views.pop(replica, None)

    def observe(self, outcome: Outcome) -> None:
        """Learns from one finished request (no-op without TTFT or a successful answer)."""
        if not outcome.ok or outcome.ttft_s is None or outcome.ttft_s <= 0:
            return
        own = self._own.get(outcome.decision.replica)
        if own is None:
            own = self._own[outcome.decision.replica] = self._start()
        for rates in (own, self._fleet):
            self._learn_service(rates, outcome)
            self._learn_rates(rates, outcome)
        self._views.clear()

    def _learn_service(self, rates: ReplicaRates, outcome: Outcome) -> None:
        cfg = self._cfg
        new_tokens = outcome.request.max_new_tokens or cfg.default_new_tokens
        sample = (outcome.ttft_s or 0.0) + new_tokens * cfg.decode_s_per_token
        start = cfg.overhead_s + cfg.default_new_tokens * cfg.decode_s_per_token
        rates.service_s = robust_update(rates.service_s, sample, start)

    def _learn_rates(self, rates: ReplicaRates, outcome: Outcome) -> None:
        cfg, b = self._cfg, outcome.decision.breakdown
        prompt = float(outcome.prompt_tokens or outcome.request.prompt_tokens)
        gpu_pred = b.get("gpu_tokens", 0.0)
        reload_pred = b.get("host_tokens", 0.0) + b.get("storage_tokens", 0.0)
        cached = float(outcome.cached_tokens) if outcome.cached_tokens is not None else gpu_pred + reload_pred
        uncached = max(0.0, prompt - cached)
        reloaded = min(max(cached - gpu_pred, 0.0), reload_pred)
        work = (outcome.ttft_s or 0.0) - rates.overhead_s - b.get("queue_s", 0.0)
        prefill_s = uncached / rates.prefill_tokens_per_s
        reload_s = reloaded / rates.host_tokens_per_s
        rates.samples += 1
        if uncached < MIN_SAMPLE_TOKENS and reloaded < MIN_SAMPLE_TOKENS:
            sample = (outcome.ttft_s or 0.0) - b.get("queue_s", 0.0) - prefill_s - reload_s
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


class CharsPerToken:
    """Learned bytes of canonical prompt per engine token (robust EWMA of reported prompt tokens)."""

    def __init__(self, start: float) -> None:
        self._start = start
        self.value = start

    def observe(self, canonical_bytes: int, prompt_tokens: int | None) -> None:
        """One request's canonical length against the ``usage.prompt_tokens`` its replica reported."""
        if not prompt_tokens or prompt_tokens < 16 or canonical_bytes <= 0:
            return
        self.value = robust_update(self.value, canonical_bytes / prompt_tokens, self._start)

    def observe_outcome(self, outcome: Outcome, block_chars: int) -> None:
        """The same from an Outcome: the canonical length is recovered from the request's estimate
        (``prompt_tokens x block_chars / block_tokens``, exact up to rounding)."""
        req = outcome.request
        if outcome.ok and req.block_tokens > 0:
            self.observe(round(req.prompt_tokens * block_chars / req.block_tokens), outcome.prompt_tokens)
