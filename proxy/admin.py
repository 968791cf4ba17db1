"""The admin API: list, add, remove and drain replicas, behind ``Authorization: Bearer <admin key>``.

    GET    /admin/replicas                          → {"replicas": [status, ...]}
    POST   /admin/replicas        {"url": U}        → 201 {"replica": status} (checked at once)
    DELETE /admin/replicas        {"url": U}        → 200 {"removed": U}       (in-flight requests finish)
    POST   /admin/replicas/drain  {"url": U, "draining": true|false}
                                                    → 200 {"replica": status}  (no new requests)

Without ``--admin-key`` the admin API is disabled (403). A wrong or missing key is 401. Keys are
compared in constant time. ``authorize_reader`` guards ``/status`` and ``/metrics``: with an admin key
or a ``--status-key`` set (and no ``--public-status``), one of the two is needed.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from proxy.openai import parse_json
from proxy.setting_converters import parse_url


def _carries(request: web.Request, key: str | None) -> bool:
    """Does the request carry ``Authorization: Bearer <key>`` (compared in constant time)?"""
    given = request.headers.get("Authorization", "")
    return key is not None and hmac.compare_digest(given.encode(errors="replace"), f"Bearer {key}".encode())


def is_admin(request: web.Request, gw: Gateway) -> bool:
    return _carries(request, gw.settings.admin_key)


def authorize(request: web.Request, gw: Gateway) -> None:
    """403 when the admin key is not configured, 401 when the request does not carry it."""
    if gw.settings.admin_key is None:
        raise Forbidden("admin endpoints are disabled: start kvroute with --admin-key")
    if not is_admin(request, gw):
        raise Unauthorized("invalid or missing admin key")


def authorize_reader(request: web.Request, gw: Gateway) -> None:
    """``/status`` and ``/metrics``: open unless ``Settings.status_protected``; then the admin key or the
    read-only ``--status-key`` (401 otherwise)."""
    st = gw.settings
    if not st.status_protected or is_admin(request, gw) or _carries(request, st.status_key):
        return
    raise Unauthorized(
        "this gateway's /status and /metrics need its admin key or its --status-key: "
        "send Authorization: Bearer <key>"
    )


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
    authorize(request, gw)
    return _json({"replicas": [r.status() for r in gw.fleet.replicas()]})


async def add_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw)
    url, _ = await _url_arg(request)
    replica = gw.fleet.add(url)
    await gw.fleet.check(gw.up, replica, refresh=True)
    return _json({"replica": replica.status()}, status=201)


async def remove_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw)
    url, _ = await _url_arg(request)
    if not gw.fleet.remove(url):
        raise NotFound(f"no replica {url}", param="url")
    return _json({"removed": url})


async def drain_replica(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw)
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
