"""Prometheus collectors read at scrape time: the fleet, the cache model, the replicas' own metrics.

Nothing here is updated on the request path: each collector reads its source when ``/metrics`` is
scraped, so a family always shows the fleet as it is now.

- ``MembershipCollector``: ``kvroute_replica_healthy``, ``kvroute_inflight_requests`` per replica.
- ``AccuracyCollector``: the cache model's predicted vs reported cached tokens (means, error ratio).
- ``FleetCollector``: per replica the load in work (``proxy/load.py``: queued prefill seconds and tokens,
  utilization, arrival rate, draining) and the cache model per tier (``routing.status``): blocks, the
  engine tokens they weigh, the capacity, and the estimated bytes ``table_bytes + KEY_BYTES x blocks``
  (the dict table measured, a 64-bit int key per block; a key shared by two tiers is counted in each, so
  this is an upper bound); the tickets still open.
- ``ScrapedCollector``: each replica's ``sglang:*`` figures as ``kvroute_replica_sglang_<name>{replica}``
  (gauges; ``prompt_tokens_total`` and ``cached_tokens_total{cache_source}`` as counters), the hit ratio
  per tier over the scraper's window, and the scraper's own state (metrics enabled, age of the last good
  scrape, failed scrapes, duration).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.replica_metrics import GAUGES, ReplicaScraper
from routing.calibration import AccuracyStats
from routing.status import TierView

if TYPE_CHECKING:
    from proxy.fleet import Fleet
    from routing.router import Router

KEY_BYTES = sys.getsizeof(1 << 63)  # one 64-bit block hash as a Python int


def _gauge(name: str, help_: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, labels=list(labels))


class MembershipCollector(Collector):
    """Per replica at scrape time: (id, requests in flight, healthy)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, int, bool]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        inflight = _gauge("kvroute_inflight_requests", "Requests in flight per replica", "replica")
        healthy = _gauge("kvroute_replica_healthy", "1 when the replica is in the pool, else 0", "replica")
        for replica, n, ok in self._source():
            inflight.add_metric([replica], n)
            healthy.add_metric([replica], 1.0 if ok else 0.0)
        yield inflight
        yield healthy


class AccuracyCollector(Collector):
    """The cache model's accuracy per replica, read from ``CacheModel.accuracy()`` at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, AccuracyStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        predicted = _gauge(
            "kvroute_model_cached_tokens_predicted_mean", "Mean cached tokens the model predicted", "replica"
        )
        actual = _gauge(
            "kvroute_model_cached_tokens_actual_mean", "Mean cached tokens the replica reported", "replica"
        )
        error = _gauge(
            "kvroute_model_error_ratio", "Sum |predicted - reported cached| / sum prompt tokens", "replica"
        )
        for replica, a in self._source().items():
            predicted.add_metric([replica], a.mean_predicted_tokens)
            actual.add_metric([replica], a.mean_actual_tokens)
            error.add_metric([replica], a.error_ratio)
        yield from (predicted, actual, error)


def tier_bytes(t: TierView) -> float:
    """The estimated bytes of one modelled tier (see the module docstring)."""
    return float(t.table_bytes + KEY_BYTES * t.blocks)


class FleetCollector(Collector):
    """Load in work and the cache model, per replica (see the module docstring)."""

    def __init__(self, fleet: Fleet, router: Router) -> None:
        self._fleet, self._router = fleet, router

    def collect(self) -> Iterator[Metric]:
        yield from self._load()
        yield from self._cache_model()

    def _load(self) -> Iterator[Metric]:
        rid = "replica"
        queued_s = _gauge("kvroute_replica_queued_prefill_seconds", "Predicted prefill work queued", rid)
        queued_t = _gauge("kvroute_replica_queued_prefill_tokens", "Uncached prompt tokens queued", rid)
        util = _gauge("kvroute_replica_utilization_ratio", "Decaying fraction of time prefill was busy", rid)
        rate = _gauge("kvroute_replica_arrival_rate_per_second", "Decaying rate of requests routed", rid)
        draining = _gauge("kvroute_replica_draining", "1 while the replica is draining", rid)
        now = time.monotonic()
        for r in self._fleet.replicas():
            s = r.state(now)
            queued_s.add_metric([r.id], s.inflight_prefill_s)
            queued_t.add_metric([r.id], s.inflight_prefill_tokens)
            util.add_metric([r.id], s.utilization)
            rate.add_metric([r.id], s.arrival_rate)
            draining.add_metric([r.id], 1.0 if r.draining else 0.0)
        yield from (queued_s, queued_t, util, rate, draining)

    def _cache_model(self) -> Iterator[Metric]:
        labels = ("replica", "tier")
        blocks = _gauge("kvroute_cache_model_blocks", "Blocks the cache model holds", *labels)
        tokens = _gauge("kvroute_cache_model_tokens", "Engine tokens its blocks weigh", *labels)
        capacity = _gauge("kvroute_cache_model_capacity_tokens", "Modelled tier capacity", *labels)
        size = _gauge("kvroute_cache_model_bytes", "Estimated memory of the modelled tier", *labels)
        status = self._router.status()
        for replica, view in status.replicas.items():
            for tier, t in (("gpu", view.gpu), ("host", view.host), ("storage", view.storage)):
                blocks.add_metric([replica, tier], t.blocks)
                tokens.add_metric([replica, tier], t.tokens)
                capacity.add_metric([replica, tier], t.capacity_tokens)
                size.add_metric([replica, tier], tier_bytes(t))
        tickets = _gauge("kvroute_open_tickets", "Routed requests not finished yet")
        tickets.add_metric([], status.open_tickets)
        yield from (blocks, tokens, capacity, size, tickets)


class ScrapedCollector(Collector):
    """The replicas' own figures and the scraper's state (see the module docstring)."""

    def __init__(self, scraper: ReplicaScraper) -> None:
        self._scraper = scraper

    def collect(self) -> Iterator[Metric]:
        yield from self._values()
        yield from self._state()

    def _values(self) -> Iterator[Metric]:
        prefix = "kvroute_replica_sglang_"
        gauges = {n: _gauge(prefix + n, f"The replica's sglang:{n}", "replica") for n in GAUGES}
        prompt = CounterMetricFamily(
            prefix + "prompt_tokens", "sglang:prompt_tokens_total", labels=["replica"]
        )
        cached = CounterMetricFamily(
            prefix + "cached_tokens", "sglang:cached_tokens_total", labels=["replica", "cache_source"]
        )
        ratio = _gauge(
            "kvroute_replica_hit_ratio", "Cached / prompt tokens per tier, recent", "replica", "tier"
        )
        for replica, state in self._scraper.states.items():
            latest = state.latest
            if latest is None:
                continue
            for name, value in latest.gauges.items():
                gauges[name].add_metric([replica], value)
            prompt.add_metric([replica], latest.prompt_tokens)
            for source, value in latest.cached_tokens.items():
                cached.add_metric([replica, source], value)
            for tier, value in (self._scraper.hit_ratio(replica) or {}).items():
                ratio.add_metric([replica, tier], value)
        yield from (*gauges.values(), prompt, cached, ratio)

    def _state(self) -> Iterator[Metric]:
        rid = "replica"
        enabled = _gauge("kvroute_replica_metrics_enabled", "1 when the replica serves /metrics", rid)
        age = _gauge("kvroute_replica_scrape_age_seconds", "Seconds since the last good scrape", rid)
        errors = CounterMetricFamily("kvroute_replica_scrape_errors", "Failed scrapes", labels=[rid])
        took = _gauge("kvroute_replica_scrape_duration_seconds", "Duration of the last scrape", rid)
        now = time.monotonic()
        for replica, state in self._scraper.states.items():
            if state.enabled is not None:
                enabled.add_metric([replica], 1.0 if state.enabled else 0.0)
            seconds = self._scraper.age_s(replica, now)
            if seconds is not None:
                age.add_metric([replica], seconds)
            errors.add_metric([replica], state.errors)
            took.add_metric([replica], state.duration_s)
        yield from (enabled, age, errors, took)
