"""What one gateway observes of itself and its fleet: a per-app Prometheus registry (never the global
one), the recent history behind /status, and the replicas' own metrics.

Families (``kvroute_`` prefix, base units; labels bounded: routes, status codes, error codes, reasons,
tiers and the fleet's replica ids, never a request id or a prompt). Counted as requests are answered:

kvroute_requests_total{route,status}                  answers by route (aiohttp path) and HTTP status
kvroute_errors_total{route,status_class,error}        answers >= 400: ``error`` is the code of the error
                                                      kvroute made (upstream_unavailable, upstream_timeout,
                                                      no_replica_available, model_not_found, ...) or
                                                      ``replica`` for a replica's own error answer, relayed
kvroute_decisions_total{policy,reason}                routing decisions by Reason
kvroute_upstream_errors_total{replica,kind}           connection failures, timeouts, 5xx before the first byte
kvroute_retries_total{replica}                        attempts moved to another replica
kvroute_first_byte_waits_extended_total{replica}      first-byte deadlines passed while the replica was
                                                      working: the request kept waiting
                                                      (proxy/upstream/liveness.py)
kvroute_retry_budget_exhausted_total{route}           retries the retry budget refused (the error returned)
kvroute_stream_errors_total{replica}                  streams cut after their first byte (one SSE error event)
kvroute_client_disconnects_total{route}               clients that left early (upstream aborted)
kvroute_rejections_total{reason}                      refused before routing: draining, gateway_full,
                                                      replicas_full, unauthorized, rate_limited
kvroute_ttft_seconds{route}                           histogram: upstream send to first body byte (streams)
kvroute_replica_ttft_seconds{replica}                 the same, per replica
kvroute_request_duration_seconds{route}               histogram: upstream send to the end of a good answer
kvroute_replica_request_duration_seconds{replica}     the same, per replica
kvroute_prompt_tokens_total / kvroute_cached_tokens_total{replica}   from the relayed ``usage``
kvroute_predicted_cached_tokens_total{replica}        what the cache model predicted for those same requests

Collected at scrape time (``proxy/observe/collectors.py``): replica health, requests in flight, queued prefill
work (seconds, tokens), utilization and arrival rate (``proxy/fleet/load.py``); each replica's circuit breaker
(``kvroute_replica_breaker_state`` 0 closed, 1 half-open, 2 open; ``kvroute_replica_breaker_trips_total``);
the cache model's blocks, tokens, capacity and estimated bytes per replica and tier; its prediction
accuracy; each replica's own ``sglang:*`` figures re-exported as ``kvroute_replica_sglang_<name>{replica}``
with the scraper's state (``proxy/fleet/replica_metrics.py``); the process's own ``process_*`` figures
(memory, CPU, file descriptors).

Written by ``proxy.observe.exposition`` (10x faster than prometheus-client's ``generate_latest``, which still
sees the same families through ``registry``); the counters and histograms are its ``FastCounter`` and
``FastHistogram``, with prometheus-client's ``labels(...).inc()`` shape.

Re-exported names get the ``kvroute_replica_sglang_`` prefix rather than keeping SGLang's name with a
``replica`` label: a Prometheus that scrapes the replicas directly as well (deploy/prometheus does) would
otherwise hold two series of ``sglang:num_running_reqs`` per replica, one of them a sampled copy up to a
scrape interval old, and every ``sum(sglang:...)`` would count the fleet twice.

Hooks for other modules:

- ``register_source(name, source, help, label="state")``: a gauge family ``kvroute_<name>{<label>}``
  read from ``source()`` (a mapping of label value to number) at every scrape; e.g. warm-up jobs or
  documents by state, ``register_source("warmup_jobs", lambda: {"queued": 2, "done": 9}, "Warm-up jobs
  by state")``, or the Redis sync state, ``register_source("state_sync", lambda: {"connected": 1.0,
  "lag_seconds": 0.2}, "Redis state sync", label="field")``. A source that raises is skipped (logged).
- ``register_section(key, source)``: ``source()`` (JSON-able) becomes ``/status[key]``; the status page
  shows the ``warmup`` section when one is registered under that key.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.registry import Collector

from proxy.fleet.replica_metrics import ReplicaScraper
from proxy.observe.collectors import AccuracyCollector, MembershipCollector, ScrapedCollector
from proxy.observe.exposition import FastCounter, FastHistogram, TextCollector, TextFamily, render
from proxy.observe.history import History, Outcome
from routing.calibration import AccuracyStats
from routing.types import Report

if TYPE_CHECKING:
    from routing.ledger import Ticket

log = logging.getLogger("kvroute.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_NAME = re.compile(r"[a-z][a-z0-9_]*")
Source = Callable[[], Mapping[str, float]]
C = TypeVar("C", bound=Collector)


class _SourceCollector(TextCollector):
    """The families other modules registered (``register_source``)."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[Source, str, str]] = {}

    def text(self) -> Iterator[str]:
        for name, (source, help_, label) in list(self.sources.items()):
            try:
                values = dict(source())
            except Exception:  # a broken source must not break the scrape
                log.exception("metrics source %s failed", name)
                continue
            fam = TextFamily(f"kvroute_{name}", help_, "gauge", (label,))
            for key, value in values.items():
                fam.add((str(key),), float(value))
            yield fam.text()


class GatewayMetrics:
    def __init__(
        self,
        replicas: Callable[[], Iterable[tuple[str, int, bool]]],
        accuracy: Callable[[], Mapping[str, AccuracyStats]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collectors: list[Collector] = []  # in registration order: what render() writes
        self._counters()
        self.ttft = self._histogram("ttft_seconds", "Upstream send to first body byte", TTFT_BUCKETS)
        self.duration = self._histogram(
            "request_duration_seconds", "Upstream send to the end of a good answer", DURATION_BUCKETS
        )
        self.history = History()
        self._replicas = replicas
        self.scraper = ReplicaScraper(lambda: [(rid, ok) for rid, _, ok in replicas()])
        self._sources = _SourceCollector()
        self._sections: dict[str, Callable[[], Any]] = {}
        self._watched = False
        self._add(MembershipCollector(replicas))
        if accuracy is not None:
            self._add(AccuracyCollector(accuracy))
        self._add(ScrapedCollector(self.scraper))
        self._add(self._sources)
        self._add(ProcessCollector(registry=None))

    def _histogram(
        self, name: str, help_: str, buckets: tuple[float, ...]
    ) -> tuple[FastHistogram, FastHistogram]:
        """Two families: ``kvroute_<name>{route}`` and ``kvroute_replica_<name>{replica}`` (not one with
        both labels: its series would grow as routes x replicas)."""
        per_route = FastHistogram(f"kvroute_{name}", help_, ("route",), buckets)
        per_replica = FastHistogram(f"kvroute_replica_{name}", help_ + ", per replica", ("replica",), buckets)
        return self._add(per_route), self._add(per_replica)

    def add(self, collector: C) -> C:
        """Another module's collector, in ``/metrics`` (``registry`` and ``render``) as the gateway's."""
        return self._add(collector)

    def _add(self, collector: C) -> C:
        self.registry.register(collector)
        self._collectors.append(collector)
        return collector

    def _counters(self) -> None:
        def counter(name: str, help_: str, *labels: str) -> FastCounter:
            return self._add(FastCounter(name, help_, labels))

        self.requests = counter("kvroute_requests", "Requests answered", "route", "status")
        self.errors = counter("kvroute_errors", "Error answers", "route", "status_class", "error")
        self.decisions = counter("kvroute_decisions", "Routing decisions", "policy", "reason")
        self.upstream_errors = counter("kvroute_upstream_errors", "Upstream failures", "replica", "kind")
        self.retries = counter("kvroute_retries", "Attempts moved to another replica", "replica")
        self.first_byte_waits_extended = counter(
            "kvroute_first_byte_waits_extended", "First-byte waits kept past their deadline", "replica"
        )
        self.retry_budget_exhausted = counter(
            "kvroute_retry_budget_exhausted", "Retries refused by the retry budget", "route"
        )
        self.stream_errors = counter("kvroute_stream_errors", "Streams cut after the first byte", "replica")
        self.disconnects = counter("kvroute_client_disconnects", "Clients that left early", "route")
        self.rejections = counter("kvroute_rejections", "Requests refused before routing", "reason")
        self.prompt_tokens = counter("kvroute_prompt_tokens", "Prompt tokens reported", "replica")
        self.cached_tokens = counter("kvroute_cached_tokens", "Cached prompt tokens reported", "replica")
        self.predicted_cached = counter(
            "kvroute_predicted_cached_tokens", "Cached tokens the cache model predicted", "replica"
        )

    # ---- what the request path reports ----
    def answered(self, route: str, status: int, error: str | None) -> None:
        """One answer sent; ``error`` is the code of an error kvroute made (None: it made none)."""
        self.requests.labels(route, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, f"{status // 100}xx", error or "replica").inc()

    def attempt_done(self, route: str, ticket: Ticket, report: Report, seconds: float) -> None:
        """One attempt on ``ticket.replica`` finished after ``seconds`` with what the replica reported."""
        replica, pred = ticket.replica, ticket.prediction
        if report.ttft_s is not None:
            for h, label in zip(self.ttft, (route, replica), strict=True):
                h.observe(report.ttft_s, label)
        if report.ok:
            for h, label in zip(self.duration, (route, replica), strict=True):
                h.observe(seconds, label)
        if report.prompt_tokens is not None:
            self.prompt_tokens.labels(replica).inc(report.prompt_tokens)
        if report.cached_tokens is not None:
            self.cached_tokens.labels(replica).inc(report.cached_tokens)
            self.predicted_cached.labels(replica).inc(pred.cached_tokens)
        self.history.add(
            Outcome(
                at=time.time(),
                route=route,
                replica=replica,
                reason=ticket.decision.reason.value,
                ok=report.ok,
                predicted_ttft_s=pred.terms.total,
                predicted_cached_tokens=pred.cached_tokens,
                ttft_s=report.ttft_s,
                prompt_tokens=report.prompt_tokens,
                cached_tokens=report.cached_tokens,
                predicted_prompt_tokens=ticket.request.prompt_tokens,
            )
        )

    # ---- hooks ----
    def register_source(self, name: str, source: Source, help_: str, label: str = "state") -> None:
        """See the module docstring; ValueError for a bad or taken name."""
        if not _NAME.fullmatch(name) or not _NAME.fullmatch(label):
            raise ValueError(f"metric source name {name!r} / label {label!r}: use [a-z][a-z0-9_]*")
        taken = {m.name for m in self.registry.collect()} | set(self._sources.sources)
        if f"kvroute_{name}" in taken or name in taken:
            raise ValueError(f"a metric family kvroute_{name} already exists")
        self._sources.sources[name] = (source, help_, label)

    def register_section(self, key: str, source: Callable[[], Any]) -> None:
        self._sections[key] = source

    def sections(self) -> dict[str, Any]:
        """The registered /status sections, each read now (one that raises is reported as its error)."""
        out: dict[str, Any] = {}
        for key, source in self._sections.items():
            try:
                out[key] = source()
            except Exception as e:
                log.exception("status section %s failed", key)
                out[key] = {"error": f"{type(e).__name__}: {e}"}
        return out

    def watch(self, collector: Collector) -> None:
        """Registers the fleet collector once the app starts (``proxy.status.observers.observe_ctx``)."""
        if not self._watched:
            self._add(collector)
            self._watched = True

    def render(self) -> bytes:
        """The text exposition (``proxy.observe.exposition``; ``generate_latest(self.registry)`` gives the
        same samples, slower, plus ``_created`` series). Series of replicas that left the fleet are dropped
        first, so label sets stay bounded by the fleet however often replicas come and go."""
        fleet = {rid for rid, _, _ in self._replicas()}
        for c in self._collectors:
            if isinstance(c, FastCounter | FastHistogram):
                c.retain("replica", fleet)
        return render(self._collectors)
