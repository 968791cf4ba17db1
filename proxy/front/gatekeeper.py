"""The middleware every client request passes before its handler: the client's API key and admission.

Generation requests are ``/generate`` and every ``/v1/*`` request that is not a GET (``/v1/models``
stays answerable while draining). For each one, in order:

1. with ``--api-keys``, the ``Authorization: Bearer <key>`` must be a known key (401 ``invalid_api_key``
   otherwise), on every ``/v1/*`` and ``/generate`` request, GETs included (``proxy/tenancy/keys.py``); the
   handler gets the key (``proxy.tenancy.namespace.CLIENT_KEY``). The header itself is never forwarded to a
   replica (``proxy/upstream/relay.py``);
2. admission (``proxy/fleet/admission.py``): 503 while draining, 429 past ``max_inflight``; the request counts
   as in progress until its handler returns (a stream, until its last byte).

Paths are compared on whole segments (``proxy.front.request_guard.has_prefix``), after the request guard
refused dot segments, so no prefix can be escaped. ``/v1/warmup`` takes the admin key or a client key
(``proxy/warm/api.py`` decides what each may do): here a client key it carries is attached, and nothing
is refused. Admin endpoints keep the admin key (``proxy/admin/replicas.py``); ``/status`` and ``/metrics``
their own check (``proxy/front/operations.py``); ``/health`` and ``/ready`` are open.
"""

from __future__ import annotations

from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import RateLimited, Unauthorized
from proxy.front.handlers import Handler
from proxy.front.request_guard import has_prefix
from proxy.tenancy.admin_key import is_admin
from proxy.tenancy.namespace import CLIENT_KEY

WARMUP = "/v1/warmup"  # under /v1 but with its own authorization (proxy/warm/api.py)


def is_client_api(path: str) -> bool:
    if has_prefix(path, WARMUP):
        return False
    return has_prefix(path, "/v1") or path == "/generate"


def is_generation(request: web.Request) -> bool:
    return is_client_api(request.path) and request.method != "GET"


def authenticate(request: web.Request, gw: Gateway) -> None:
    """Attaches the request's client key (``CLIENT_KEY``); 401 for a wrong or missing key on the client
    API. A warm-up request's key is attached when it is a client key, never refused here."""
    if gw.keys is None:
        return
    client_api = is_client_api(request.path)
    if not client_api and not has_prefix(request.path, WARMUP):
        return
    key = gw.keys.authenticate(request.headers.get("Authorization"))
    if key is not None:
        request[CLIENT_KEY] = key
    elif client_api and not _operator_read(request, gw):
        gw.admission.reject("unauthorized")
        raise Unauthorized("Incorrect or missing API key: send Authorization: Bearer <key>")


def _operator_read(request: web.Request, gw: Gateway) -> bool:
    """The admin key may list the served models (``kvroute warm`` asks which model to warm)."""
    return (
        request.method == "GET" and has_prefix(request.path, "/v1/models") and is_admin(request, gw.settings)
    )


@web.middleware
async def gatekeeper(request: web.Request, handler: Handler) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    authenticate(request, gw)
    if not is_generation(request):
        return await handler(request)
    gw.admission.enter()
    try:
        return await handler(request)
    except RateLimited:
        gw.admission.reject("rate_limited")
        raise
    finally:
        gw.admission.leave()
