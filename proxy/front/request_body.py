"""The request body under limits, before any handler runs: a middleware every route goes through.

- **Content type**: the OpenAI generation routes (``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/responses``) take ``application/json`` only, as OpenAI and SGLang do; any other type (or none)
  is a 400 ``unsupported_content_type`` in OpenAI's shape (after the size check: an oversized body is a
  413 whatever its type). Other routes parse the body as JSON whatever its type says (``/generate`` like
  SGLang's native API).
- **Size**: a declared ``Content-Length`` over ``--max-body-bytes`` is a 413 before a byte is read.
- **Deadline**: the whole body must arrive within ``--body-timeout`` seconds of the headers; a client
  that drips it (slowloris) gets a 408 and its connection is closed, so it cannot hold a handler, a
  socket and a buffer for ever. The body read here is kept by aiohttp: handlers read it again for free.

Idle connections (no request yet, or headers that never finish) are closed by the server after
``--client-idle-timeout`` seconds (``proxy.runtime.serving``: aiohttp's keep-alive timer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.context import GATEWAY
from proxy.errors import InvalidRequest, PayloadTooLarge, RequestTimeout

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_ONLY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


def _check_content_type(request: web.Request) -> None:
    if request.method != "POST" or request.path not in JSON_ONLY_PATHS:
        return
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type", "")
        raise InvalidRequest(
            f"Unsupported content type: {given!r}. This API method only accepts 'application/json' "
            "requests; send the body as JSON with 'Content-Type: application/json'",
            code="unsupported_content_type",
        )


async def _too_late(request: web.Request, deadline_s: float) -> web.Response:
    """The 408, sent now, then the connection closed: aiohttp would otherwise linger, reading the rest
    of a dripped body for up to 10 s."""
    resp = RequestTimeout(f"the request body did not arrive within {deadline_s:g} s").to_response()
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    if request.transport is not None:
        request.transport.close()
    return resp


async def _read(request: web.Request, limit: int, deadline_s: float) -> web.Response | None:
    """Reads the whole body within the deadline; the 408 answer when it did not arrive in time."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes"
        )
    try:
        async with asyncio.timeout(deadline_s):
            await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from None
    except TimeoutError:
        return await _too_late(request, deadline_s)
    return None


@web.middleware
async def body_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Content type, size and deadline of the body (module docstring), then the handler."""
    if request.body_exists:
        st = request.app[GATEWAY].settings
        late = await _read(request, st.max_body_bytes, st.body_timeout)
        if late is not None:
            return late
    _check_content_type(request)
    return await handler(request)
