"""HTTP handlers. A generation request reads top to bottom as the data flow of docs/design.md:
parse (once) → input limits (``proxy/front/input_limits.py``) → check model → the tenant's namespace and rate
limits (``proxy/tenancy/namespace.py``) → [the prompt as token ids, with ``--tokenizer-path``] → [the response
cache, when on: a hit answers here] → route (the Router decides and records: a Ticket) → forward (relay,
retry, finish the ticket, release, abort).

Also here: an OpenAI-shaped 405 for a method a route does not take; and the middleware
that turns ``GatewayError`` (and aiohttp's own HTTP errors) into OpenAI-shaped JSON, counts every
answer, and writes the opt-in access log. The operational endpoints are in ``proxy/front/operations.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.answers.cache import RESPONSE_CACHE
from proxy.context import GATEWAY
from proxy.dispatch.forward import forward
from proxy.errors import GatewayError, MethodNotAllowed, PayloadTooLarge
from proxy.front.input_limits import check_limits
from proxy.front.openai import parse_request
from proxy.observe.access_log import access_of, log_access
from proxy.tenancy.namespace import admit
from proxy.types import Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from None


def generation(route: Route, methods: tuple[str, ...] = ("POST",)) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        access_of(request)
        if request.method not in methods:
            raise MethodNotAllowed(request.method, methods)
        gw = request.app[GATEWAY]
        raw = await read_body(request, gw.settings.max_body_bytes)
        st = gw.settings
        parsed = parse_request(route, raw, request.headers.get(st.session_header), st.session_field)
        check_limits(parsed, raw, st)
        parsed, raw, charge = await admit(request, gw.limiter, gw.resolve_model(parsed), raw)
        try:
            parsed = await gw.exact(parsed)
            cache = request.app.get(RESPONSE_CACHE)
            if cache is not None:
                return await cache.serve(
                    request, parsed, lambda tap: forward(request, gw, raw, parsed, gw.route(parsed), tap)
                )
            return await forward(request, gw, raw, parsed, gw.route(parsed))
        finally:
            if charge is not None:
                charge.settle(access_of(request))

    return handle


def _route_label(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


_HTTP_ERRORS = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """GatewayError → OpenAI-shaped JSON (with the request id); counts every answer by route and status,
    and every error answer by the code of the error kvroute made (``GatewayMetrics.answered``)."""
    gw = request.app[GATEWAY]
    error: str | None = None  # the code of the error kvroute made, a metric label
    try:
        resp = await handler(request)
    except GatewayError as e:
        error = e.code or e.type
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
        error = _HTTP_ERRORS.get(e.status, err.type)
        resp = err.to_response({"Allow": e.headers["Allow"]} if "Allow" in e.headers else None)
    gw.metrics.answered(_route_label(request), resp.status, error)
    if gw.settings.access_log:
        log_access(request, resp)
    return resp
