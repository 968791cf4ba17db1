"""The middleware every client request passes before its handler: the client's API key and admission.

Generation requests are ``/generate`` and every ``/v1/*`` request that is not a GET (``/v1/models``
stays answerable while draining). For each one, in order:

1. with ``--api-keys``, the ``Authorization: Bearer <key>`` must be a known key (401 ``invalid_api_key``
   otherwise), on every ``/v1/*`` and ``/generate`` request, GETs included (``proxy/api_keys.py``); the
   handler gets the key (``proxy.tenancy.CLIENT_KEY``) and a request without the Authorization header;
2. admission (``proxy/admission.py``): 503 while draining, 429 past ``max_inflight``; the request counts
   as in progress until its handler returns (a stream, until its last byte).

Admin endpoints keep the admin key (``proxy/admin.py``), ``/v1/warmup`` included (it passes here
untouched: warm-ups are placed without a tenant, so tenants' requests do not match warmed documents);
``/health``, ``/ready``, ``/status`` and
``/metrics`` pass untouched.
"""

from __future__ import annotations

from aiohttp import web

from proxy.access_log import access_of
from proxy.context import GATEWAY, Gateway
from proxy.errors import RateLimited, Unauthorized
from proxy.handlers import Handler
from proxy.tenancy import CLIENT_KEY

ADMIN_PATHS = ("/v1/warmup",)  # under /v1/ but behind the admin key (proxy/warm_api.py)


def is_client_api(path: str) -> bool:
    if path.startswith(ADMIN_PATHS):
        return False
    return path.startswith("/v1/") or path == "/generate"


def is_generation(request: web.Request) -> bool:
    return is_client_api(request.path) and request.method != "GET"


def authenticated(request: web.Request, gw: Gateway) -> web.Request:
    """The request as its handler sees it: its key under ``CLIENT_KEY`` and without the Authorization
    header (the key is kvroute's, not the replicas'); 401 for a wrong or missing key."""
    if gw.keys is None or not is_client_api(request.path):
        return request
    key = gw.keys.authenticate(request.headers.get("Authorization"))
    if key is None:
        gw.admission.reject("unauthorized")
        raise Unauthorized("Incorrect or missing API key: send Authorization: Bearer <key>")
    access_of(request)  # shared with the clone: the access log sees what the handler records
    headers = request.headers.copy()
    del headers["Authorization"]
    clone = request.clone(headers=headers)
    clone[CLIENT_KEY] = key
    return clone


@web.middleware
async def gatekeeper(request: web.Request, handler: Handler) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    request = authenticated(request, gw)
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
