"""What a replica says about itself, parsed from ``/get_server_info`` and ``/get_model_info`` (pure).

Capacities follow the contract's §4 recipe, per TP rank:
- GPU tokens = ``internal_states[0].memory_usage.token_capacity``, else ``max_total_num_tokens``;
- host tokens (HiCache on): with ``hicache_size == 0``, ``ceil_page(floor(gpu x hicache_ratio)) + page``;
  otherwise ``hicache_size x 1e9 / bytes_per_token`` with
  ``bytes_per_token = kvcache_GiB x 2^30 / token_capacity``;
- storage: present when ``hicache_storage_backend`` is set; its size is not reported, so it is modelled
  as unbounded (``STORAGE_UNBOUNDED`` tokens; the cache model's own memory budget still applies).
Hybrid models (GDN/Mamba + attention) are recognised by ``architectures``/``model_type``. A hybrid model
resumes a cached prefix only where it holds the recurrent state (contract §3.2): with
``--mamba-scheduler-strategy extra_buffer`` at every ``mamba_track_interval`` tokens (page aligned) and
nowhere else; otherwise at the end of each prefill chunk (``chunked_prefill_size``; -1 = no chunking, so
only at the end of a served prompt) and at the end of each served prompt. ``resume_interval`` and
``resume_at_end`` carry that to the cache model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from routing.types import WritePolicy

STORAGE_UNBOUNDED = 1 << 40
_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
UNCHUNKED_INTERVAL = 1 << 40  # resume interval of a hybrid replica without chunked prefill: never mid-prompt
DEFAULT_TRACK_INTERVAL = 256  # SGLang's --mamba-track-interval default
_HYBRID_MARKERS = ("mamba", "jamba", "next", "hybrid", "nemotronh", "falconh1", "lfm2", "kimilinear", "zamba")


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    served_model: str
    gpu_tokens: int
    host_tokens: int
    storage_tokens: int
    page_size: int
    write_policy: WritePolicy | None
    hybrid: bool
    max_running_requests: int
    started_at: float
    cache_report: bool = False  # --enable-cache-report: a usage without prompt_tokens_details means 0 cached
    chunked_prefill_size: int = 0  # tokens per prefill chunk; -1 = chunking off, 0 = not reported
    mamba_scheduler_strategy: str = ""  # hybrid: "no_buffer", "extra_buffer" or "auto" (= no_buffer)
    mamba_track_interval: int = 0  # hybrid with extra_buffer: tokens between tracked states; 0 = not reported
    kv_events_config: str = ""  # --kv-events-config as JSON text ("" = none; proxy/sync/kv_subscriber.py)
    in_send_order: bool = True  # prefills start in arrival order: one scheduler, FCFS (see ``in_order``)
    disaggregation_mode: str | None = None  # PD: null, prefill or decode; None: not reported (fleet/roles.py)
    bootstrap_port: int = 0  # a prefill's --disaggregation-bootstrap-port as reported, 0 = not reported

    @property
    def resume_interval(self) -> int:
        """Engine tokens between resume points of a hybrid model (see the module docstring); 0 = any point
        resumes (not hybrid, or the chunk size is not reported)."""
        if not self.hybrid:
            return 0
        if self.mamba_scheduler_strategy == "extra_buffer":
            track = self.mamba_track_interval or DEFAULT_TRACK_INTERVAL
            return max(track // self.page_size, 1) * self.page_size
        if self.chunked_prefill_size < 0:
            return UNCHUNKED_INTERVAL
        return self.chunked_prefill_size

    @property
    def resume_at_end(self) -> bool:
        """Whether a served prompt's end is a resume point (extra_buffer keeps only tracked states)."""
        return not self.hybrid or self.mamba_scheduler_strategy != "extra_buffer"


def _num(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def _memory_usage(info: Mapping[str, Any]) -> Mapping[str, Any]:
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        mu = states[0].get("memory_usage")
        if isinstance(mu, dict):
            return mu
    return {}


def host_tokens(info: Mapping[str, Any], gpu_tokens: int, page: int) -> int:
    if not info.get("enable_hierarchical_cache"):
        return 0
    size_gb = _num(info, "hicache_size")
    if size_gb > 0:
        kv_gib = _num(_memory_usage(info), "kvcache")
        if kv_gib <= 0 or gpu_tokens <= 0:
            return 0
        return int(size_gb * 1e9 / (kv_gib * 2**30 / gpu_tokens))
    raw = math.floor(gpu_tokens * _num(info, "hicache_ratio", 2.0))
    return math.ceil(raw / page) * page + page


def is_hybrid(model_info: Mapping[str, Any]) -> bool:
    names = model_info.get("architectures")
    words = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    if isinstance(model_info.get("model_type"), str):
        words.append(model_info["model_type"])
    return any(m in w.lower().replace("_", "").replace("-", "") for w in words for m in _HYBRID_MARKERS)


def parse_replica_info(info: Mapping[str, Any], model_info: Mapping[str, Any]) -> ReplicaInfo:
    page = max(1, int(_num(info, "page_size", 1)))
    gpu = int(_num(_memory_usage(info), "token_capacity") or _num(info, "max_total_num_tokens"))
    policy = info.get("hicache_write_policy", "write_through")
    write_policy = (
        cast(WritePolicy, policy)
        if info.get("enable_hierarchical_cache") and policy in _WRITE_POLICIES
        else None
    )
    model = info.get("served_model_name") or info.get("model_path") or model_info.get("model_path") or ""
    return ReplicaInfo(
        served_model=str(model),
        gpu_tokens=gpu,
        host_tokens=host_tokens(info, gpu, page),
        storage_tokens=STORAGE_UNBOUNDED
        if info.get("enable_hierarchical_cache") and info.get("hicache_storage_backend")
        else 0,
        page_size=page,
        write_policy=write_policy,
        hybrid=is_hybrid(model_info),
        max_running_requests=int(_num(info, "max_running_requests")),
        started_at=_num(info, "startup_time"),
        cache_report=bool(info.get("enable_cache_report")),
        chunked_prefill_size=int(_num(info, "chunked_prefill_size")),
        mamba_scheduler_strategy=str(info.get("mamba_scheduler_strategy") or ""),
        mamba_track_interval=int(_num(info, "mamba_track_interval")),
        kv_events_config=_json_text(info.get("kv_events_config")),
        in_send_order=in_order(info),
        disaggregation_mode=_mode(info.get("disaggregation_mode")),
        bootstrap_port=int(_num(info, "disaggregation_bootstrap_port")),
    )


def _mode(v: object) -> str | None:
    """SGLang's ``disaggregation_mode`` (``null`` for an ordinary server); None when it reports none."""
    return str(v) if isinstance(v, str) and v else None


def in_order(info: Mapping[str, Any]) -> bool:
    """Whether the replica starts prefills in arrival order: ``--schedule-policy fcfs`` (the default, and
    what a replica that does not say runs), one scheduler (``dp_size`` 1: with data parallelism each rank
    has its own queue) and no priority scheduling. Only then does a request whose first byte comes
    before an earlier one's say that the earlier one is not merely queued (``proxy/fleet/load.py``)."""
    policy = str(info.get("schedule_policy") or "fcfs")
    dp = int(_num(info, "dp_size", 1))
    return policy == "fcfs" and dp <= 1 and not info.get("enable_priority_scheduling")


def _json_text(v: object) -> str:
    """A config SGLang reports as a JSON string (or, in some versions, as an object)."""
    if isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True) if isinstance(v, dict) else ""
