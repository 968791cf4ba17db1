"""The admin API: list, add, remove and drain replicas, behind ``Authorization: Bearer <admin key>``.

    GET    /admin/replicas                          → {"replicas": [status, ...]}
    POST   /admin/replicas        {"url": U}        → 201 {"replica": status} (checked at once)
    DELETE /admin/replicas        {"url": U}        → 200 {"removed": U}       (in-flight requests finish)
    POST   /admin/replicas/drain  {"url": U, "draining": true|false}
                                                    → 200 {"replica": status}  (no new requests)

Without ``--admin-key`` the admin API is disabled (403). A wrong or missing key is 401. Keys are
compared in constant time (``proxy/tenancy/admin_key.py``).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.config.urls import parse_url
from proxy.context import GATEWAY
from proxy.errors import InvalidRequest, NotFound
from proxy.front.openai import parse_json
from proxy.tenancy.admin_key import authorize


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


async def _url_arg(request: web.Request) -> tuple[str, dict[str, Any]]:
    body = parse_json(await request.read()) if request.body_exists else dict(request.query)
    url = body.get("url")
    if not isinstance(url, str):
        raise InvalidRequest("'url' is required", param="url")
    try:
        return parse_url(url), body
    except ValueError as e:
        raise InvalidRequest(f"'url': {e}", param="url") from None


async def list_replicas(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    return _json({"replicas": [r.status() for r in gw.fleet.replicas()]})


async def add_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    url, _ = await _url_arg(request)
    replica = gw.fleet.add(url)
    await gw.fleet.check(gw.up, replica, refresh=True)
    return _json({"replica": replica.status()}, status=201)


async def remove_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    url, _ = await _url_arg(request)
    if not gw.fleet.remove(url):
        raise NotFound(f"no replica {url}", param="url")
    return _json({"removed": url})


async def drain_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    url, body = await _url_arg(request)
    draining = body.get("draining", True)
    if not isinstance(draining, bool):
        raise InvalidRequest("'draining' must be a boolean", param="draining")
    if not gw.fleet.drain(url, draining):
        raise NotFound(f"no replica {url}", param="url")
    replica = gw.fleet.get(url)
    return _json({"replica": replica.status() if replica else None})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/replicas", list_replicas)
    app.router.add_post("/admin/replicas", add_replica)
    app.router.add_delete("/admin/replicas", remove_replica)
    app.router.add_post("/admin/replicas/drain", drain_replica)
