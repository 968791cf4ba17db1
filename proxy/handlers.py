"""HTTP handlers. A generation request reads top to bottom as the data flow of docs/design.md:
parse (once) → check model → route (the Router decides and records: a Ticket) → forward (relay, retry,
finish the ticket, release, abort).

Also here: ``GET /v1/models`` (union over healthy replicas, deduplicated by id), ``GET
/v1/models/{model}``, pass-through of any other ``/v1/*`` path (routed by the same policy, the body's
``model`` honoured when present), ``/health``, ``/status`` and ``/metrics``; and the middleware that
turns ``GatewayError`` into OpenAI-shaped JSON and counts every answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.tcp_helpers import tcp_nodelay

from proxy.context import GATEWAY, Gateway
from proxy.errors import GatewayError, ModelNotFound, PayloadTooLarge, UpstreamError
from proxy.forward import forward
from proxy.openai import parse_request, passthrough_request
from proxy.types import Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MODELS_TIMEOUT_S = 5.0


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from None


def generation(route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        gw = request.app[GATEWAY]
        if request.transport is not None:
            tcp_nodelay(request.transport, True)
        raw = await read_body(request, gw.settings.max_body_bytes)
        st = gw.settings
        parsed = parse_request(route, raw, request.headers.get(st.session_header), st.session_field)
        gw.check_model(parsed.model)
        ticket = gw.route(parsed)
        return await forward(request, gw, raw, parsed, ticket)

    return handle


async def passthrough(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    if request.transport is not None:
        tcp_nodelay(request.transport, True)
    raw = await read_body(request, gw.settings.max_body_bytes)
    st = gw.settings
    parsed = passthrough_request(raw, request.headers.get(st.session_header), st.session_field)
    gw.check_model(parsed.model)
    ticket = gw.route(parsed)
    return await forward(request, gw, raw, parsed, ticket)


async def _replica_models(gw: Gateway, replica: str) -> list[dict[str, Any]]:
    try:
        doc = await gw.up.get_json(replica, "/v1/models", MODELS_TIMEOUT_S)
    except UpstreamError:
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    return (
        [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if isinstance(data, list)
        else []
    )


async def model_list(gw: Gateway) -> list[dict[str, Any]]:
    healthy = [s.id for s in gw.fleet.snapshot(None) if s.healthy]
    merged: dict[str, dict[str, Any]] = {}
    for models in await asyncio.gather(*(_replica_models(gw, r) for r in healthy)):
        for m in models:
            merged.setdefault(m["id"], m)
    return list(merged.values())


async def list_models(request: web.Request) -> web.Response:
    data = await model_list(request.app[GATEWAY])
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    for m in await model_list(request.app[GATEWAY]):
        if m["id"] == name:
            return web.Response(body=orjson.dumps(m), content_type="application/json")
    raise ModelNotFound(f"The model '{name}' does not exist", param="model")


async def flush_cache(request: web.Request) -> web.Response:
    """Fans ``/flush_cache`` out to every healthy replica (as sglang-router does); 200 only if all did."""
    gw = request.app[GATEWAY]
    targets = [s.id for s in gw.fleet.snapshot(None) if s.healthy]

    async def one(replica: str) -> tuple[str, int]:
        try:
            status, _ = await gw.up.call(
                replica, "POST", "/flush_cache" + request.path_qs[len(request.path) :], 30.0
            )
        except UpstreamError:
            status = 502
        if 200 <= status < 300:
            gw.router.restart(replica)  # the radix tree and the host pool are reset, L3 storage is not
        return replica, status

    results = dict(await asyncio.gather(*(one(r) for r in targets)))
    ok = bool(results) and all(200 <= s < 300 for s in results.values())
    return web.Response(
        status=200 if ok else 502,
        body=orjson.dumps({"flushed": ok, "replicas": results}),
        content_type="application/json",
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def status(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    replicas = [r.status() for r in gw.fleet.replicas()]
    router = gw.router.status()
    doc = {
        "time": time.time(),
        "policy": router.policy,
        "healthy_replicas": sum(1 for r in replicas if r["healthy"]),
        "replicas": replicas,
        "models": sorted(gw.fleet.models()),
        "cache_model": {rid: dataclasses.asdict(a) for rid, a in gw.router.accuracy().items()},
        "router": dataclasses.asdict(router),
        "config": {k: v for k, v in gw.settings.redacted().items() if k not in {"backends"}},
    }
    return web.Response(body=orjson.dumps(doc, default=str), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _route_label(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """GatewayError → OpenAI-shaped JSON (with the request id); counts every answer by route/status."""
    gw = request.app[GATEWAY]
    try:
        resp = await handler(request)
    except GatewayError as e:
        headers = (
            {"x-request-id": request.headers.get("x-request-id", "")}
            if gw.settings.request_id_headers
            else {}
        )
        resp = e.to_response({k: v for k, v in headers.items() if v})
    except web.HTTPException as e:
        if e.status < 400:
            raise
        err = GatewayError(e.reason)
        err.status, err.type = e.status, "invalid_request_error" if e.status < 500 else "internal_error"
        resp = err.to_response()
    gw.metrics.requests.labels(_route_label(request), str(resp.status)).inc()
    return resp
