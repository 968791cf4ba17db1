"""Prometheus metrics with SGLang 0.5.10's `sglang:*` names, one CollectorRegistry per replica app.

Scheduler-side series carry the labels model_name, engine_type ("unified"; a PD server's mode), tp_rank,
pp_rank and moe_ep_rank ("0"); tokenizer-side series carry model_name only (cached_tokens_total adds
cache_source, and a cache_source series appears only after its first non-zero increment, as in SGLang).
Gauges are refreshed from the engine and the cache right before each scrape; cumulative cache counters
(evictions, load-backs, backups, prefetches) are advanced by the delta of RadixCache.stats() since the
last scrape.
Latency histograms are in *modelled* seconds (real seconds divided by the time scale), i.e. what the
real server would report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from emulator.engine import Engine
from emulator.tickets import Prefilled

_SCHED = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.8, 1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 400, 800)
_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.1, 0.25)
_QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 100, 200, 300)
_CACHE_COUNTERS = (
    ("evicted_tokens_total", "evicted_tokens"),
    ("load_back_tokens_total", "load_back_tokens"),
    ("prefetched_tokens_total", "prefetched_tokens"),
    ("backuped_tokens_total", "backuped_tokens"),
)


@dataclass(slots=True)
class LiveCounters:
    """Plain counters the debug endpoint and /v1/loads read (no Prometheus needed)."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generation_tokens_total: int = 0
    aborted_total: int = 0
    last_hit_rate: float = 0.0
    # prompt tokens the cache held when a request arrived and no longer held when it was admitted: what
    # was evicted under requests while they waited (a router that knew the cache exactly when it routed,
    # and foresaw what its in-flight requests would add, still over-predicts by this much)
    arrival_lost_tokens_total: int = 0


class Metrics:
    """The replica's registry; also the engine's EngineListener."""

    def __init__(self, model_name: str, mamba_slots: int = 0, engine_type: str = "unified") -> None:
        self._mamba_slots = mamba_slots
        self.registry = CollectorRegistry()
        self.live = LiveCounters()
        self._labels = {"model_name": model_name, "engine_type": engine_type, "tp_rank": "0"}
        self._labels |= {"pp_rank": "0", "moe_ep_rank": "0"}
        self._model = model_name
        self._cache_seen: dict[str, int] = {}
        self._tp_mark = (time.monotonic(), 0)
        self._throughput = 0.0
        r = self.registry
        self.gauges = {
            name: Gauge(f"sglang:{name}", doc, _SCHED, registry=r)
            for name, doc in (
                ("num_running_reqs", "The number of running requests."),
                ("num_queue_reqs", "The number of requests in the waiting queue."),
                ("num_used_tokens", "The number of used tokens."),
                ("token_usage", "The token usage."),
                ("cache_hit_rate", "The prefix cache hit rate of the latest prefill batch."),
                ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
                ("gen_throughput", "The generation throughput (token/s)."),
                ("hicache_host_used_tokens", "Used tokens in the HiCache host pool."),
                ("hicache_host_total_tokens", "Total tokens in the HiCache host pool."),
                ("mamba_usage", "The mamba state pool usage."),
                ("new_token_ratio", "The new token ratio."),
            )
        }
        self.cache_counters = {
            stat: Counter(f"sglang:{name.removesuffix('_total')}", f"Cumulative {stat}.", _SCHED, registry=r)
            for name, stat in _CACHE_COUNTERS
        }
        tok = ("model_name",)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prefill tokens processed.", tok, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generated tokens.", tok, registry=r)
        self.cached_tokens = Counter(
            "sglang:cached_tokens", "Prefix-cached tokens.", ("model_name", "cache_source"), registry=r
        )
        self.requests = Counter("sglang:num_requests", "Requests processed.", tok, registry=r)
        self.aborted = Counter("sglang:num_aborted_requests", "Aborted requests.", tok, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "TTFT.", tok, buckets=_TTFT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "E2E latency.", tok, buckets=_E2E_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Inter-token latency.",
            tok,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Queue time.", _SCHED, buckets=_QUEUE_BUCKETS, registry=r
        )

    @property
    def labels(self) -> dict[str, str]:
        """The scheduler-side labels (other series of the registry, e.g. pd_stats.py, reuse them)."""
        return dict(self._labels)

    # ---- EngineListener ---------------------------------------------------------------------
    def on_admit(self, queue_s: float, prefilled: Prefilled, prompt_tokens: int) -> None:
        self.queue_time.labels(**self._labels).observe(queue_s)
        self.live.requests_total += 1
        self.live.prompt_tokens_total += prompt_tokens
        self.live.cached_tokens_total += prefilled.cached_tokens
        self.live.arrival_lost_tokens_total += max(0, prefilled.arrival_cached - prefilled.cached_tokens)
        self.prompt_tokens.labels(self._model).inc(prompt_tokens)
        for source, value in (("device", prefilled.device), ("host", prefilled.host)):
            if value > 0:
                self.cached_tokens.labels(self._model, source).inc(value)
        if prefilled.storage > 0:
            self.cached_tokens.labels(self._model, "storage").inc(prefilled.storage)

    def on_step(self, hit_tokens: int, new_tokens: int) -> None:
        total = hit_tokens + new_tokens
        self.live.last_hit_rate = hit_tokens / total if total else 0.0

    def on_tokens(self, count: int) -> None:
        self.live.generation_tokens_total += count
        if count:
            self.generation_tokens.labels(self._model).inc(count)

    # ---- handler-side observations (modelled seconds) ---------------------------------------
    def on_finish(self, ttft_s: float | None, e2e_s: float, itl_s: float | None) -> None:
        self.requests.labels(self._model).inc()
        if ttft_s is not None:
            self.ttft.labels(self._model).observe(ttft_s)
        if itl_s is not None:
            self.itl.labels(self._model).observe(itl_s)
        self.e2e.labels(self._model).observe(e2e_s)

    def on_abort(self) -> None:
        self.live.aborted_total += 1
        self.aborted.labels(self._model).inc()

    def throughput(self, time_scale: float) -> float:
        """Generated tokens per modelled second since the previous call (at most once a second)."""
        now, tokens = time.monotonic(), self.live.generation_tokens_total
        then, before = self._tp_mark
        if now - then >= 1.0:
            self._throughput = (tokens - before) / ((now - then) / time_scale)
            self._tp_mark = (now, tokens)
        return self._throughput

    def render(self, engine: Engine, time_scale: float) -> bytes:
        self._refresh(engine, time_scale)
        return generate_latest(self.registry)

    def _refresh(self, engine: Engine, time_scale: float) -> None:
        stats = engine.cache.stats()
        g = {name: gauge.labels(**self._labels) for name, gauge in self.gauges.items()}
        g["num_running_reqs"].set(engine.running)
        g["num_queue_reqs"].set(len(engine.waiting))
        g["num_used_tokens"].set(stats.gpu_used)
        g["token_usage"].set(stats.gpu_used / stats.gpu_capacity if stats.gpu_capacity else 0.0)
        g["cache_hit_rate"].set(self.live.last_hit_rate)
        g["max_total_num_tokens"].set(stats.gpu_capacity)
        g["gen_throughput"].set(self.throughput(time_scale))
        g["hicache_host_used_tokens"].set(stats.host_used)
        g["hicache_host_total_tokens"].set(stats.host_capacity)
        g["mamba_usage"].set(stats.mamba_used / self._mamba_slots if self._mamba_slots else 0.0)
        g["new_token_ratio"].set(1.0)  # admission charges running requests their whole output (engine.py)
        for _name, stat in _CACHE_COUNTERS:
            value = int(getattr(stats, f"{stat}_total"))
            delta = value - self._cache_seen.get(stat, 0)
            self._cache_seen[stat] = value
            if delta > 0:
                self.cache_counters[stat].labels(**self._labels).inc(delta)
