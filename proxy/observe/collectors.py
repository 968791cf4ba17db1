"""Prometheus collectors read at scrape time: the fleet, the cache model, the replicas' own metrics.

Nothing here is updated on the request path: each collector reads its source when ``/metrics`` is
scraped, so a family always shows the fleet as it is now. They write text (``proxy.observe.exposition``).

- ``MembershipCollector``: ``kvroute_replica_healthy``, ``kvroute_inflight_requests`` per replica.
- ``AccuracyCollector``: the cache model's predicted vs reported cached tokens (means, error ratio).
- ``FleetCollector``: per replica the load in work (``proxy/fleet/load.py``: queued prefill seconds and
  tokens, the KV held by requests in flight, utilization, arrival rate, draining), its circuit breaker (state,
  trips) and the cache model per tier (``routing.status``): blocks, the engine tokens they weigh, the
  capacity, and the estimated bytes ``table_bytes + KEY_BYTES x blocks`` (the dict table measured, a
  64-bit int key per block; a key shared by two tiers is counted in each, so this is an upper bound);
  the tickets still open.
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

from proxy.fleet.replica_metrics import GAUGES, ReplicaScraper
from proxy.observe.exposition import TextCollector, TextFamily
from proxy.upstream.breaker import STATE_CODES
from routing.calibration import AccuracyStats
from routing.status import TierView

if TYPE_CHECKING:
    from proxy.fleet.fleet import Fleet
    from routing.router import Router

KEY_BYTES = sys.getsizeof(1 << 63)  # one 64-bit block hash as a Python int
REPLICA = ("replica",)
REPLICA_TIER = ("replica", "tier")


def _gauge(name: str, help_: str, labels: tuple[str, ...] = REPLICA) -> TextFamily:
    return TextFamily(name, help_, "gauge", labels)


def _counter(name: str, help_: str, labels: tuple[str, ...] = REPLICA) -> TextFamily:
    return TextFamily(name + "_total", help_, "counter", labels)


class MembershipCollector(TextCollector):
    """Per replica at scrape time: (id, requests in flight, healthy)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, int, bool]]]) -> None:
        self._source = source

    def text(self) -> Iterator[str]:
        inflight = _gauge("kvroute_inflight_requests", "Requests in flight per replica")
        healthy = _gauge("kvroute_replica_healthy", "1 when the replica is in the pool, else 0")
        for replica, n, ok in self._source():
            inflight.add((replica,), n)
            healthy.add((replica,), 1.0 if ok else 0.0)
        yield inflight.text()
        yield healthy.text()


class AccuracyCollector(TextCollector):
    """The cache model's accuracy per replica, read from ``CacheModel.accuracy()`` at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, AccuracyStats]]) -> None:
        self._source = source

    def text(self) -> Iterator[str]:
        predicted = _gauge(
            "kvroute_model_cached_tokens_predicted_mean", "Mean cached tokens the model predicted"
        )
        actual = _gauge("kvroute_model_cached_tokens_actual_mean", "Mean cached tokens the replica reported")
        error = _gauge("kvroute_model_error_ratio", "Sum |predicted - reported cached| / sum prompt tokens")
        for replica, a in self._source().items():
            predicted.add((replica,), a.mean_predicted_tokens)
            actual.add((replica,), a.mean_actual_tokens)
            error.add((replica,), a.error_ratio)
        yield from (predicted.text(), actual.text(), error.text())


def tier_bytes(t: TierView) -> float:
    """The estimated bytes of one modelled tier (see the module docstring)."""
    return float(t.table_bytes + KEY_BYTES * t.blocks)


class FleetCollector(TextCollector):
    """Load in work and the cache model, per replica (see the module docstring)."""

    def __init__(self, fleet: Fleet, router: Router) -> None:
        self._fleet, self._router = fleet, router

    def text(self) -> Iterator[str]:
        yield from self._load()
        yield from self._cache_model()

    def _load(self) -> Iterator[str]:
        queued_s = _gauge("kvroute_replica_queued_prefill_seconds", "Predicted prefill work queued")
        queued_t = _gauge("kvroute_replica_queued_prefill_tokens", "Uncached prompt tokens queued")
        held = _gauge("kvroute_replica_held_kv_tokens", "KV held by requests in flight (prompt + budget)")
        util = _gauge("kvroute_replica_utilization_ratio", "Decaying fraction of time prefill was busy")
        rate = _gauge("kvroute_replica_arrival_rate_per_second", "Decaying rate of requests routed")
        draining = _gauge("kvroute_replica_draining", "1 while the replica is draining")
        breaker = _gauge("kvroute_replica_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open")
        trips = _counter("kvroute_replica_breaker_trips", "Times the circuit breaker opened")
        idle = _counter(
            "kvroute_replica_idle_while_queued_seconds", "Seconds idle while another replica had a queue"
        )
        now = time.monotonic()
        self._fleet.balance.refresh(self._fleet.replicas(), now)
        for r in self._fleet.replicas():
            s, key = r.state(now), (r.id,)
            queued_s.add(key, s.inflight_prefill_s)
            queued_t.add(key, s.inflight_prefill_tokens)
            held.add(key, s.kv_tokens)
            util.add(key, s.utilization)
            rate.add(key, s.arrival_rate)
            draining.add(key, 1.0 if r.draining else 0.0)
            breaker.add(key, STATE_CODES[r.breaker.state(now)])
            trips.add(key, r.breaker.trips_total)
            idle.add(key, self._fleet.balance.seconds(r.id))
        yield from (f.text() for f in (queued_s, queued_t, held, util, rate, draining, breaker, trips, idle))

    def _cache_model(self) -> Iterator[str]:
        blocks = _gauge("kvroute_cache_model_blocks", "Blocks the cache model holds", REPLICA_TIER)
        tokens = _gauge("kvroute_cache_model_tokens", "Engine tokens its blocks weigh", REPLICA_TIER)
        capacity = _gauge("kvroute_cache_model_capacity_tokens", "Modelled tier capacity", REPLICA_TIER)
        size = _gauge("kvroute_cache_model_bytes", "Estimated memory of the modelled tier", REPLICA_TIER)
        status = self._router.status()
        for replica, view in status.replicas.items():
            for tier, t in (("gpu", view.gpu), ("host", view.host), ("storage", view.storage)):
                key = (replica, tier)
                blocks.add(key, t.blocks)
                tokens.add(key, t.tokens)
                capacity.add(key, t.capacity_tokens)
                size.add(key, tier_bytes(t))
        tickets = _gauge("kvroute_open_tickets", "Routed requests not finished yet", ())
        tickets.add((), status.open_tickets)
        yield from (f.text() for f in (blocks, tokens, capacity, size, tickets))


class ScrapedCollector(TextCollector):
    """The replicas' own figures and the scraper's state (see the module docstring)."""

    def __init__(self, scraper: ReplicaScraper) -> None:
        self._scraper = scraper

    def text(self) -> Iterator[str]:
        yield from self._values()
        yield from self._state()

    def _values(self) -> Iterator[str]:
        prefix = "kvroute_replica_sglang_"
        gauges = {n: _gauge(prefix + n, f"The replica's sglang:{n}") for n in GAUGES}
        prompt = _counter(prefix + "prompt_tokens", "The replica's sglang:prompt_tokens_total")
        cached = _counter(
            prefix + "cached_tokens", "The replica's sglang:cached_tokens_total", ("cache_source", "replica")
        )
        ratio = _gauge("kvroute_replica_hit_ratio", "Cached / prompt tokens per tier, recently", REPLICA_TIER)
        for replica, state in self._scraper.states.items():
            latest = state.latest
            if latest is None:
                continue
            for name, value in latest.gauges.items():
                gauges[name].add((replica,), value)
            prompt.add((replica,), latest.prompt_tokens)
            for source, value in latest.cached_tokens.items():
                cached.add((source, replica), value)
            for tier, value in (self._scraper.hit_ratio(replica) or {}).items():
                ratio.add((replica, tier), value)
        yield from (f.text() for f in (*gauges.values(), prompt, cached, ratio))

    def _state(self) -> Iterator[str]:
        enabled = _gauge("kvroute_replica_metrics_enabled", "1 when the replica serves /metrics")
        age = _gauge("kvroute_replica_scrape_age_seconds", "Seconds since the last good scrape")
        errors = _counter("kvroute_replica_scrape_errors", "Failed scrapes")
        took = _gauge("kvroute_replica_scrape_duration_seconds", "Duration of the last scrape")
        now = time.monotonic()
        for replica, state in self._scraper.states.items():
            key = (replica,)
            if state.enabled is not None:
                enabled.add(key, 1.0 if state.enabled else 0.0)
            seconds = self._scraper.age_s(replica, now)
            if seconds is not None:
                age.add(key, seconds)
            errors.add(key, state.errors)
            took.add(key, state.duration_s)
        yield from (f.text() for f in (enabled, age, errors, took))
