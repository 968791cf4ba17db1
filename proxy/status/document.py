"""The ``/status`` JSON document: the gateway's state for programs, and what the status page draws.

Top level: ``time`` (epoch seconds), ``policy``, ``healthy_replicas``, ``replicas`` (below), ``models``,
``cache_model`` (prediction accuracy per replica), ``router`` (``routing.status.RouterStatus``),
``config`` (settings, secrets redacted), ``decisions`` (the last routing decisions, newest first:
``proxy.observe.history.Outcome``), ``scrape_interval_s``, ``warnings`` (replicas whose view is degraded,
a state store down, a replica whose warmed documents exceed its GPU pool: ``working_set_warnings``), and
one key per section other modules registered (``GatewayMetrics.register_section``:
the warm-up API's ``warmup``, the KV events' ``kv_events``, the knowledge watch's ``knowledge``, ...).

Per replica, next to its membership and pools (``proxy.fleet.replica.Replica.status``):

- ``load``: requests in flight, queued prefill work in seconds and tokens, utilization, arrival rate
  (``proxy/fleet/load.py``, at this instant);
- ``cache_model``: per tier (gpu, host, storage) the blocks the cache model holds, the engine tokens they
  weigh, the tier's capacity in tokens and ``fill`` = tokens / capacity (None without a capacity);
- ``reported``: what the replica's own ``/metrics`` said at the last scrape (``gauges``: SGLang's
  names without the prefix; ``enabled``, ``age_s``, ``errors``, ``last_error``: the scraper's state);
- ``hit_ratio``: ``gateway`` = cached / prompt tokens over its recent requests through this gateway
  (``usage``), and ``device``/``host``/``storage`` = the replica's own split over the scrape window;
- ``ttft_recent_s``: the measured TTFTs of its recent streamed requests, oldest first; ``requests_recent``:
  how many recent requests those are among (non-streamed answers have no TTFT).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from proxy.context import Gateway
from proxy.fleet.replica import Replica
from proxy.fleet.replica_metrics import TIERS, ReplicaScraper
from routing.status import ReplicaView, TierView


def _tier(t: TierView) -> dict[str, Any]:
    fill = t.tokens / t.capacity_tokens if t.capacity_tokens > 0 else None
    return {"blocks": t.blocks, "tokens": t.tokens, "capacity_tokens": t.capacity_tokens, "fill": fill}


def _cache_model(view: ReplicaView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return {"gpu": _tier(view.gpu), "host": _tier(view.host), "storage": _tier(view.storage)}


def _reported(scraper: ReplicaScraper, replica: str, now: float) -> dict[str, Any]:
    state = scraper.states.get(replica)
    if state is None:
        return {"enabled": None, "age_s": None, "errors": 0, "last_error": None, "gauges": {}}
    latest = state.latest
    return {
        "enabled": state.enabled,
        "age_s": scraper.age_s(replica, now),
        "errors": state.errors,
        "last_error": state.last_error,
        "gauges": dict(latest.gauges) if latest is not None else {},
    }


def _load(gw: Gateway, r: Replica, now: float) -> dict[str, Any]:
    s = r.state(now)
    return {
        "inflight_requests": s.inflight_requests,
        "queued_prefill_s": s.inflight_prefill_s,
        "queued_prefill_tokens": s.inflight_prefill_tokens,
        "utilization": s.utilization,
        "arrival_rate": s.arrival_rate,
        "last_body_byte_s_ago": gw.liveness.since(r.id, now),  # seen or heard of (proxy/upstream/liveness.py)
    }


def replica_doc(gw: Gateway, r: Replica, view: ReplicaView | None, now: float) -> dict[str, Any]:
    m = gw.metrics
    tiers = m.scraper.hit_ratio(r.id) or {}
    return {
        **r.status(),
        "load": _load(gw, r, now),
        "cache_model": _cache_model(view),
        "reported": _reported(m.scraper, r.id, now),
        "hit_ratio": {"gateway": m.history.hit_ratio(r.id), **{t: tiers.get(t) for t in TIERS}},
        "ttft_recent_s": m.history.ttfts(r.id),
        "requests_recent": m.history.count(r.id),
    }


def status_document(gw: Gateway) -> dict[str, Any]:
    now = time.monotonic()
    router = gw.router.status()
    fleet = gw.fleet.replicas()
    gw.metrics.history.retain(r.id for r in fleet)
    replicas = [replica_doc(gw, r, router.replicas.get(r.id), now) for r in fleet]
    core = {
        "time": time.time(),
        "policy": router.policy,
        "healthy_replicas": sum(1 for r in replicas if r["healthy"]),
        "replicas": replicas,
        "models": sorted(gw.fleet.models()),
        "cache_model": {rid: dataclasses.asdict(a) for rid, a in gw.router.accuracy().items()},
        "router": dataclasses.asdict(router),
        "config": {k: v for k, v in gw.settings.redacted().items() if k not in {"backends"}},
        "decisions": [o.to_json() for o in gw.metrics.history.decisions()],
        "scrape_interval_s": gw.metrics.scraper.interval_s,
    }
    sections = gw.metrics.sections()
    core["warnings"] = warnings(sections, replicas)
    return {**sections, **core}  # a section never replaces a key of the core document


def warnings(sections: dict[str, Any], replicas: list[dict[str, Any]] | None = None) -> list[str]:
    """What needs a look, from the sections: replicas whose view is degraded, a state store that does
    not answer, working sets larger than a GPU pool (the replicas' own warnings are in their entries)."""
    out = [
        f"{rid}: the gateway's view is degraded: {k['reason']}"
        for rid, k in (sections.get("knowledge") or {}).items()
        if isinstance(k, dict) and k.get("state") == "degraded"
    ]
    state = sections.get("state")
    if isinstance(state, dict) and state.get("state") == "degraded":
        out.append(f"state store {state.get('store')} unavailable: {state.get('last_error')}")
    return out + working_set_warnings(sections.get("warmup"), replicas or [])


def working_set_warnings(warmup: object, replicas: list[dict[str, Any]]) -> list[str]:
    """A replica whose model's working set exceeds its GPU pool. The working set is what is meant to
    stay in GPU memory there: the tokens of the warmed documents placed on it (live placements, this
    gateway's and the others', the warm-up section's ``tokens_per_replica``). What live traffic left in
    the cache model is not added: a full GPU tier is the normal state of a busy replica."""
    placed = warmup.get("tokens_per_replica") if isinstance(warmup, dict) else None
    if not isinstance(placed, dict):
        return []
    out = []
    for r in replicas:
        tokens, gpu = placed.get(r["id"], 0), r.get("gpu_tokens") or 0
        if gpu and tokens > gpu:
            out.append(
                f"{r['id']}: the working set of {r.get('model') or 'its model'} ({round(tokens):,} tokens of "
                f"warmed documents) exceeds its GPU pool ({gpu:,} tokens): they cannot all stay in GPU "
                "memory; warm fewer documents, or place them on more replicas"
            )
    return out
