"""The operator's keys: the admin key (``--admin-key``) and the read-only status key (``--status-key``).

Both are sent as ``Authorization: Bearer <key>`` and compared in constant time. ``authorize`` guards the
admin API and replica control (403 when no admin key is configured, 401 without it);
``authorize_reader`` guards ``/status`` and ``/metrics``: open unless ``Settings.status_protected`` (an
admin or status key is set and ``--public-status`` is not), then the admin key or the status key.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from proxy.config.settings import Settings
from proxy.errors import Forbidden, Unauthorized


def _carries(request: web.Request, key: str | None) -> bool:
    """Does the request carry ``Authorization: Bearer <key>`` (compared in constant time)?"""
    given = request.headers.get("Authorization", "")
    return key is not None and hmac.compare_digest(given.encode(errors="replace"), f"Bearer {key}".encode())


def is_admin(request: web.Request, st: Settings) -> bool:
    return _carries(request, st.admin_key)


def authorize(request: web.Request, st: Settings) -> None:
    """403 when the admin key is not configured, 401 when the request does not carry it."""
    if st.admin_key is None:
        raise Forbidden("admin endpoints are disabled: start kvroute with --admin-key")
    if not is_admin(request, st):
        raise Unauthorized("invalid or missing admin key")


def authorize_reader(request: web.Request, st: Settings) -> None:
    """``/status`` and ``/metrics``: open unless ``Settings.status_protected``; then the admin key or the
    read-only ``--status-key`` (401 otherwise)."""
    if not st.status_protected or is_admin(request, st) or _carries(request, st.status_key):
        return
    raise Unauthorized(
        "this gateway's /status and /metrics need its admin key or its --status-key: "
        "send Authorization: Bearer <key>"
    )
