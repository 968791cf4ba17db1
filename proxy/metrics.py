"""Prometheus metrics of one gateway, in a per-app registry (never the global one).

kvroute_requests_total{route,status}          requests answered, by route and HTTP status
kvroute_decisions_total{policy,reason}        routing decisions by Reason
kvroute_upstream_errors_total{replica,kind}   connection failures, timeouts, 5xx before the first byte
kvroute_retries_total{replica}                 attempts moved to another replica
kvroute_stream_errors_total{replica}           streams cut after their first byte (one SSE error event)
kvroute_client_disconnects_total{route}        clients that left early (upstream aborted)
kvroute_ttft_seconds{route}                    time from the upstream send to its first body byte
kvroute_inflight_requests{replica}             requests in flight per replica (collected at scrape)
kvroute_replica_healthy{replica}               1 when the replica is in the pool, 0 when it is out
kvroute_cached_tokens_total / kvroute_prompt_tokens_total{replica}  from the relayed ``usage``
kvroute_model_cached_tokens_{predicted,actual}_mean{replica}  the cache model's prediction vs the report
kvroute_model_error_ratio{replica}             sum |predicted - reported cached| / sum prompt tokens
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from routing.calibration import AccuracyStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _ReplicaCollector(Collector):
    """Per replica at scrape time: (id, requests in flight, healthy)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, int, bool]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "kvroute_inflight_requests", "Requests in flight per replica", labels=["replica"]
        )
        healthy = GaugeMetricFamily(
            "kvroute_replica_healthy", "1 when the replica is in the pool, else 0", labels=["replica"]
        )
        for replica, n, ok in self._source():
            inflight.add_metric([replica], n)
            healthy.add_metric([replica], 1.0 if ok else 0.0)
        yield inflight
        yield healthy


class _AccuracyCollector(Collector):
    """The cache model's accuracy per replica, read from ``CacheModel.accuracy()`` at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, AccuracyStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        names = {
            "kvroute_model_cached_tokens_predicted_mean": "Mean cached tokens the model predicted",
            "kvroute_model_cached_tokens_actual_mean": "Mean cached tokens the replica reported",
            "kvroute_model_error_ratio": "Sum |predicted - reported cached| / sum prompt tokens",
        }
        fams = {n: GaugeMetricFamily(n, h, labels=["replica"]) for n, h in names.items()}
        for replica, a in self._source().items():
            fams["kvroute_model_cached_tokens_predicted_mean"].add_metric([replica], a.mean_predicted_tokens)
            fams["kvroute_model_cached_tokens_actual_mean"].add_metric([replica], a.mean_actual_tokens)
            fams["kvroute_model_error_ratio"].add_metric([replica], a.error_ratio)
        yield from fams.values()


class GatewayMetrics:
    def __init__(
        self,
        replicas: Callable[[], Iterable[tuple[str, int, bool]]],
        accuracy: Callable[[], Mapping[str, AccuracyStats]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("kvroute_requests", "Requests answered", ["route", "status"], registry=r)
        self.decisions = Counter("kvroute_decisions", "Routing decisions", ["policy", "reason"], registry=r)
        self.upstream_errors = Counter(
            "kvroute_upstream_errors", "Upstream failures", ["replica", "kind"], registry=r
        )
        self.retries = Counter(
            "kvroute_retries", "Attempts moved to another replica", ["replica"], registry=r
        )
        self.stream_errors = Counter(
            "kvroute_stream_errors", "Streams cut after the first byte", ["replica"], registry=r
        )
        self.disconnects = Counter(
            "kvroute_client_disconnects", "Clients that left early", ["route"], registry=r
        )
        self.ttft = Histogram(
            "kvroute_ttft_seconds", "Upstream time to first byte", ["route"], buckets=TTFT_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter(
            "kvroute_prompt_tokens", "Prompt tokens reported", ["replica"], registry=r
        )
        self.cached_tokens = Counter(
            "kvroute_cached_tokens", "Cached prompt tokens reported", ["replica"], registry=r
        )
        r.register(_ReplicaCollector(replicas))
        if accuracy is not None:
            r.register(_AccuracyCollector(accuracy))

    def render(self) -> bytes:
        return generate_latest(self.registry)
