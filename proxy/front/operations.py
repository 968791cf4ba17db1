"""The operational endpoints: models, cache flush, liveness, readiness, status and metrics.

GET  /v1/models             the union of the healthy replicas' models (deduplicated by id)
GET  /v1/models/{model}     one of them, or the served model an alias or the single-model fallback
                            means (``proxy/fleet/model_names.py``), under the name asked for
GET  /health                liveness: 200 while the process serves
GET  /ready                 readiness: 200 once at least one replica is healthy, else 503 (and 503
                            ``draining`` from the first SIGTERM on, ``proxy/runtime/drain.py``)
GET  /status                the gateway's state: JSON (``proxy/status/document.py``) for programs, the live
                            status page for browsers (``proxy/status/page.py``)
GET  /metrics               Prometheus text (``proxy/observe/metrics.py``)

``/status`` (its JSON) and ``/metrics`` need the admin key or ``--status-key`` when either is set,
unless ``--public-status`` (``proxy.tenancy.admin_key.authorize_reader``); the page itself holds no data.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import ModelNotFound, NoReplicaAvailable, UpstreamError
from proxy.fleet.model_names import resolve
from proxy.observe.metrics import CONTENT_TYPE
from proxy.status.document import status_document
from proxy.status.page import page_response, wants_html
from proxy.sync.state_sync import STATE_SYNC
from proxy.tenancy.admin_key import authorize_reader

MODELS_TIMEOUT_S = 5.0


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc, default=str), content_type="application/json")


async def _replica_models(gw: Gateway, replica: str) -> list[dict[str, Any]]:
    try:
        doc = await gw.up.get_json(replica, "/v1/models", MODELS_TIMEOUT_S)
    except UpstreamError:
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return []
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def model_list(gw: Gateway) -> list[dict[str, Any]]:
    healthy = [s.id for s in gw.fleet.snapshot(None) if s.healthy]
    merged: dict[str, dict[str, Any]] = {}
    for models in await asyncio.gather(*(_replica_models(gw, r) for r in healthy)):
        for m in models:
            merged.setdefault(m["id"], m)
    return list(merged.values())


async def list_models(request: web.Request) -> web.Response:
    return _json({"object": "list", "data": await model_list(request.app[GATEWAY])})


async def get_model(request: web.Request) -> web.Response:
    gw, name = request.app[GATEWAY], request.match_info["model"]
    models = {m["id"]: m for m in await model_list(gw)}
    st = gw.settings
    if not models:  # no healthy replica answered: a 404 would blame the name
        raise NoReplicaAvailable(f"no healthy replica to list models; tried: {gw.fleet.answers()}")
    served = resolve(name, models, dict(st.model_aliases), st.single_model_fallback)
    if served is None or served.split(":", 1)[0] not in models:
        raise ModelNotFound(f"The model '{name}' does not exist", param="model")
    model = models[served.split(":", 1)[0]]
    return _json(model if model["id"] == name else {**model, "id": name, "root": model["id"]})


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


def readiness(app: web.Application) -> tuple[bool, dict[str, Any]]:
    """What ``/ready`` answers: ready once a replica is healthy (in a prefill/decode fleet: a server of
    each role) and, with ``--state``, the start-up replay of the shared log is done (or gave up after
    ``proxy.sync.state_sync.START_WAIT_S``); the document."""
    gw = app[GATEWAY]
    if gw.admission.draining:
        return False, {"status": "draining", "inflight": gw.admission.inflight}
    replicas = gw.fleet.replicas()
    healthy = sum(1 for r in replicas if r.healthy and r.info is not None)
    sync = app.get(STATE_SYNC)
    replaying = sync is not None and not sync.ready.is_set()
    ok = healthy and gw.fleet.serving() and not replaying
    doc = {
        "status": "ready" if ok else "not ready",
        "healthy_replicas": healthy,
        "replicas": len(replicas),
        **({"state": "replaying the shared log"} if replaying else {}),
    }
    return bool(ok), doc


def awaited(app: web.Application) -> str | None:
    """What the start-up ready line waits for (``proxy/runtime/serving.py``): None once it may be printed,
    when ``/ready`` says ready or when no replica was configured (``--admin-key`` alone: the replicas come
    from ``POST /admin/replicas`` later, and ``/ready`` answers 503 until one of them is healthy)."""
    st = app[GATEWAY].settings
    ok, doc = readiness(app)
    if ok or not (st.backends or st.discover or st.prefill or st.decode):
        return None
    if doc["healthy_replicas"] and doc.get("state"):
        return "the replay of the shared state log"
    return f"a healthy replica: {app[GATEWAY].fleet.answers()}"


async def ready(request: web.Request) -> web.Response:
    ok, doc = readiness(request.app)
    return _json(doc, status=200 if ok else 503)


async def status(request: web.Request) -> web.Response:
    """The page (no data in it: it asks for the key when the document needs one) or the document."""
    if wants_html(request):
        return page_response()
    authorize_reader(request, request.app[GATEWAY].settings)
    return _json(status_document(request.app[GATEWAY]))


async def metrics(request: web.Request) -> web.Response:
    authorize_reader(request, request.app[GATEWAY].settings)
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v1/models", list_models)
    r.add_get("/v1/models/{model}", get_model)
    r.add_get("/health", health)
    r.add_get("/ready", ready)
    r.add_get("/status", status)
    r.add_get("/metrics", metrics)
