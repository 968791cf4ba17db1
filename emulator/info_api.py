"""Read-only SGLang routes: health, server/model info, loads, models (contract §1.1, §1.3, §4, §5.3).

/server_info is every server arg flattened at the top level plus the scheduler handshake
(`status`, `max_total_num_tokens`, `max_req_input_len`), `internal_states[0]` (the args again plus
`memory_usage {weight, kvcache GiB, token_capacity, graph}`), `version` and `startup_time` (which changes
on an emulated restart). `kv_events_config` is the replica's own publisher config as JSON (or null).
Prefill/decode disaggregation adds its ServerArgs fields (`disaggregation_mode`, ... pd_stats.py), its
queued prompt tokens to /get_load's `num_tokens`, and /v1/loads?include=disagg (or all) a
`disaggregation` section to each load.
/health answers after a modelled 1 s (the real one polls once a second).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from aiohttp import web

from emulator.config import SGLANG_VERSION
from emulator.errors import json_response
from emulator.replica import REPLICA, WEIGHT_VERSION, Replica

VERSION = SGLANG_VERSION
WEIGHT_GB = 26.0


def server_args(replica: Replica) -> dict[str, Any]:
    c = replica.cfg
    return {
        "model_path": c.model_path,
        "tokenizer_path": c.tokenizer_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "served_model_name": c.served_model_name,
        "host": c.host,
        "port": replica.port,
        "page_size": c.page_size,
        "context_length": c.context_length,
        "max_total_tokens": c.max_total_tokens,
        "max_running_requests": c.max_running_requests,
        "chunked_prefill_size": c.chunked_prefill_size,
        "max_prefill_tokens": c.max_prefill_tokens,
        "mem_fraction_static": c.mem_fraction_static,
        "kv_cache_dtype": c.kv_cache_dtype,
        "disable_radix_cache": c.disable_radix_cache,
        "enable_hierarchical_cache": c.hicache,
        "hicache_ratio": c.hicache_ratio,
        "hicache_size": c.hicache_size,
        "hicache_write_policy": c.hicache_write_policy,
        "hicache_io_backend": c.hicache_io_backend,
        "hicache_mem_layout": c.hicache_mem_layout,
        "hicache_storage_backend": c.hicache_storage_backend,
        "hicache_storage_prefetch_policy": "best_effort",
        "hicache_storage_backend_extra_config": c.hicache_storage_backend_extra_config,
        "schedule_policy": c.schedule_policy,
        "radix_eviction_policy": "lru",
        "enable_cache_report": c.enable_cache_report,
        "enable_response_store": c.enable_response_store,
        "enable_metrics": c.enable_metrics,
        "kv_events_config": kv_events_config(replica),
        "tp_size": c.tp_size,
        "dp_size": c.dp_size,
        "enable_dp_attention": False,
        "mamba_scheduler_strategy": c.mamba_scheduler_strategy,
        "max_mamba_cache_size": c.max_mamba_cache_size,
        "mamba_track_interval": c.mamba_track_interval,
        "tool_call_parser": c.tool_call_parser,
        "reasoning_parser": c.reasoning_parser,
        "random_seed": c.random_seed,
        "api_key": None,
        "admin_api_key": None,
        "incremental_streaming_output": False,
        "enable_streaming_session": False,
        **replica.pd.server_args(),
    }


def kv_events_config(replica: Replica) -> str | None:
    """The --kv-events-config JSON as this replica runs it (SGLang reports the flag's string): every
    field, with this replica's endpoints (the ports offset by its index among --replicas, port_plan.py)."""
    c = replica.cfg
    if c.kv_events is None:
        return None
    return json.dumps(dataclasses.asdict(c.kv_events.for_replica(c.replica_index, c.kv_port_stride)))


def memory_usage(replica: Replica) -> dict[str, Any]:
    kv = replica.cfg.gpu_tokens * replica.cfg.emu_kv_bytes_per_token / 2**30
    return {
        "weight": WEIGHT_GB,
        "kvcache": round(kv, 2),
        "token_capacity": replica.cfg.gpu_tokens,
        "graph": 0.5,
    }


async def server_info(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    args = server_args(replica)
    internal = dict(args)
    internal |= {
        "last_gen_throughput": replica.metrics.throughput(replica.cfg.time_scale),
        "memory_usage": memory_usage(replica),
        "effective_max_running_requests_per_dp": replica.cfg.max_running_requests,
    }
    body = args | {
        "status": "ready",
        "max_total_num_tokens": replica.cfg.gpu_tokens,
        "max_req_input_len": replica.cfg.max_req_input_len,
        "internal_states": [internal],
        "version": VERSION,
        "startup_time": replica.startup_time,
    }
    return json_response(body)


async def model_info(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    c = replica.cfg
    hybrid = c.emu_hybrid
    body = {
        "model_path": c.model_path,
        "tokenizer_path": c.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": WEIGHT_VERSION,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3_next" if hybrid else "qwen3",
        "architectures": ["Qwen3NextForCausalLM" if hybrid else "Qwen3ForCausalLM"],
    }
    return json_response(body)


async def health(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    if not replica.healthy():
        return web.Response(status=503)
    await asyncio.sleep(replica.cfg.time_scale)
    return web.Response(status=200 if replica.healthy() else 503)


async def ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[REPLICA].healthy() else 503)


def _model_card(replica: Replica) -> dict[str, Any]:
    name = replica.cfg.served_model_name
    return {
        "id": name,
        "object": "model",
        "created": int(replica.startup_time),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": replica.cfg.context_length,
    }


async def models(request: web.Request) -> web.Response:
    return json_response({"object": "list", "data": [_model_card(request.app[REPLICA])]})


async def model(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    name = request.match_info["model"]
    if name != replica.cfg.served_model_name:
        err = {
            "message": f"The model '{name}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return json_response({"error": err}, 404)
    return json_response(_model_card(replica))


async def get_load(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    engine = replica.engine
    waiting_tokens = sum(len(t.work.prompt) for t in engine.waiting)
    load = {
        "rid": None,
        "http_worker_ipc": None,
        "dp_rank": 0,
        "num_reqs": engine.running + len(engine.waiting),
        "num_waiting_reqs": len(engine.waiting),
        "num_tokens": engine.cache.stats().gpu_used + waiting_tokens + replica.pd.queued_tokens(),
        "ts_tic": time.time(),
    }
    return json_response([load])


def _load(replica: Replica) -> dict[str, Any]:
    engine, stats = replica.engine, replica.engine.cache.stats()
    usage = stats.gpu_used / stats.gpu_capacity if stats.gpu_capacity else 0.0
    mem = memory_usage(replica)
    return {
        "dp_rank": 0,
        "num_running_reqs": engine.running,
        "num_waiting_reqs": len(engine.waiting),
        "num_used_tokens": stats.gpu_used,
        "max_total_num_tokens": stats.gpu_capacity,
        "token_usage": round(usage, 4),
        "gen_throughput": replica.metrics.throughput(replica.cfg.time_scale),
        "cache_hit_rate": replica.metrics.live.last_hit_rate,
        "utilization": round(usage, 4),
        "max_running_requests": replica.cfg.max_running_requests,
        "num_total_reqs": engine.running + len(engine.waiting),
        "memory": {
            "weight_gb": mem["weight"],
            "kv_cache_gb": mem["kvcache"],
            "graph_gb": mem["graph"],
            "token_capacity": mem["token_capacity"],
        },
        "queues": {"waiting": len(engine.waiting), "grammar": 0, "paused": 0, "retracted": 0},
    }


async def loads(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    load = _load(replica)
    if {"disagg", "all"} & set(request.query.get("include", "").split(",")):
        load["disaggregation"] = replica.pd.loads_section()
    if request.query.get("format") == "prometheus":
        lines = [
            f'sglang_{key}{{dp_rank="0"}} {float(value)}'
            for key, value in load.items()
            if isinstance(value, int | float) and key != "dp_rank"
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
    aggregate = {
        "total_running_reqs": load["num_running_reqs"],
        "total_waiting_reqs": load["num_waiting_reqs"],
        "total_reqs": load["num_total_reqs"],
        "avg_token_usage": load["token_usage"],
        "avg_throughput": load["gen_throughput"],
        "avg_utilization": load["utilization"],
    }
    body = {"timestamp": time.time(), "version": VERSION, "dp_rank_count": 1, "loads": [load]}
    return json_response(body | {"aggregate": aggregate})
