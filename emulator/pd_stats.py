"""What one replica reports about prefill/decode disaggregation (pd-contract.md §2.6, §2.7).

`PdStats` holds the replica's PD queues and transfer figures, fed by the PD runtime (pd_runs.py):

- a prefill's *bootstrap* queue (requests waiting for their decode to register the room; SGLang 0.5.10
  names its gauge `num_prefill_prealloc_queue_reqs`) and *inflight* queue (computed, KV being sent);
- a decode's *prealloc* queue (waiting for KV memory: the engine's waiting requests, read from the
  engine) and *transfer* queue (admitted, waiting for the room's KV).

It answers `/server_info`'s PD fields (every server reports them, `disaggregation_mode: "null"` too),
the tokens `/get_load` adds for the PD queues, `/v1/loads?include=disagg`'s `disaggregation` section and,
with --enable-metrics in PD mode, SGLang's series on the replica's registry: gauges
`sglang:num_prefill_prealloc_queue_reqs`, `num_prefill_inflight_queue_reqs`,
`num_decode_prealloc_queue_reqs`, `num_decode_transfer_queue_reqs`; counters
`sglang:num_bootstrap_failed_reqs_total`, `num_transfer_failed_reqs_total`; histograms
`sglang:kv_transfer_speed_gb_s` and `kv_transfer_latency_ms` (modelled figures, observed on the prefill).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from emulator.pd_config import PdConfig

_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


@dataclass(slots=True)
class _Series:
    bootstrap_failed: Counter
    transfer_failed: Counter
    speed: Histogram
    latency: Histogram


@dataclass(eq=False, slots=True)
class PdStats:
    cfg: PdConfig
    bootstrap_port: int = 0  # the port the bootstrap server bound (a prefill's), set once it listens
    bootstrap_reqs: int = 0
    bootstrap_tokens: int = 0
    inflight_reqs: int = 0
    transfer_reqs: int = 0
    bootstrap_failed: int = 0
    transfer_failed: int = 0
    last_speed_gb_s: float = 0.0
    last_latency_ms: float = 0.0
    waiting: Callable[[], int] = lambda: 0  # the engine's waiting requests (a decode's prealloc queue)
    _series: _Series | None = field(default=None, repr=False)
    _labels: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def null(cls) -> PdStats:
        """The stats of a server outside PD (disaggregation_mode null)."""
        return cls(PdConfig())

    def attach(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        """Register SGLang's PD series (PD mode only); gauges read this object at scrape time."""
        names = tuple(labels)
        gauges: dict[str, Callable[[], float]] = {
            "num_prefill_prealloc_queue_reqs": lambda: self.bootstrap_reqs,
            "num_prefill_inflight_queue_reqs": lambda: self.inflight_reqs,
            "num_decode_prealloc_queue_reqs": self.decode_prealloc_reqs,
            "num_decode_transfer_queue_reqs": lambda: self.transfer_reqs,
        }
        for name, read in gauges.items():
            doc = f"The number of requests in the {name[4:-5].replace('_', ' ')}."
            Gauge(f"sglang:{name}", doc, names, registry=registry).labels(**labels).set_function(read)
        self._series = _Series(
            Counter(
                "sglang:num_bootstrap_failed_reqs", "Bootstrap failed requests.", names, registry=registry
            ),
            Counter("sglang:num_transfer_failed_reqs", "Transfer failed requests.", names, registry=registry),
            Histogram(
                "sglang:kv_transfer_speed_gb_s",
                "KV transfer speed in GB/s.",
                names,
                buckets=_SPEED_BUCKETS,
                registry=registry,
            ),
            Histogram(
                "sglang:kv_transfer_latency_ms",
                "KV transfer latency in ms.",
                names,
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
        )
        self._labels = labels
        self._series.bootstrap_failed.labels(**labels)  # a counter reads 0 from the start
        self._series.transfer_failed.labels(**labels)

    def decode_prealloc_reqs(self) -> int:
        return self.waiting() if self.cfg.mode == "decode" else 0

    # ---- events ---------------------------------------------------------------------------------
    def on_bootstrap_failed(self) -> None:
        self.bootstrap_failed += 1
        if self._series is not None:
            self._series.bootstrap_failed.labels(**self._labels).inc()

    def on_transfer_failed(self) -> None:
        self.transfer_failed += 1
        if self._series is not None:
            self._series.transfer_failed.labels(**self._labels).inc()

    def on_transfer(self, seconds: float, size_bytes: int) -> None:
        """A completed transfer of `size_bytes` in `seconds` (modelled)."""
        self.last_latency_ms = seconds * 1000.0
        self.last_speed_gb_s = size_bytes / 1e9 / seconds if seconds > 0 else 0.0
        if self._series is not None:
            self._series.speed.labels(**self._labels).observe(self.last_speed_gb_s)
            self._series.latency.labels(**self._labels).observe(self.last_latency_ms)

    # ---- reports --------------------------------------------------------------------------------
    def server_args(self) -> dict[str, Any]:
        """The PD fields of SGLang's flattened ServerArgs in /server_info."""
        c = self.cfg
        return {
            "disaggregation_mode": c.mode,
            "disaggregation_transfer_backend": c.transfer_backend,
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "disaggregation_ib_device": c.ib_device,
            "disaggregation_decode_enable_offload_kvcache": False,
            "disaggregation_decode_polling_interval": 1,
            "num_reserved_decode_tokens": c.num_reserved_decode_tokens,
            "load_balance_method": c.resolved_load_balance_method,
        }

    def queued_tokens(self) -> int:
        """What /get_load's num_tokens adds: the prompts in a prefill's bootstrap queue (a decode's prealloc
        queue is the engine's waiting queue, counted already)."""
        return self.bootstrap_tokens

    def loads_section(self) -> dict[str, Any]:
        """/v1/loads' `disaggregation` section (include=disagg)."""
        return {
            "mode": self.cfg.mode,
            "prefill_prealloc_queue_reqs": self.bootstrap_reqs,
            "prefill_inflight_queue_reqs": self.inflight_reqs,
            "decode_prealloc_queue_reqs": self.decode_prealloc_reqs(),
            "decode_transfer_queue_reqs": self.transfer_reqs,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": self.last_speed_gb_s,
            "kv_transfer_latency_ms": self.last_latency_ms,
        }
