"""One attempt's streamed answer relayed, and what a failing replica or a departed client costs it.

Relay: the stream's first chunk must come by the attempt's first-byte deadline (until then the request
can move on to another replica, as for an in-band 5xx error that a stream begins with); then SSE chunk
by chunk, each within ``idle_timeout``; a failure after the first streamed byte (a cut, an idle stream, a
stream that ends without ``[DONE]``) sends one SSE error event and ends the body (no ``[DONE]``); the
client's connection is not closed after it (a server closing a keep-alive connection after a complete
body races with the client's next request on it). A client that stops reading (one write waits past
``--client-write-timeout``) is treated as gone: its connection is dropped and the request aborted
upstream, so a stalled reader cannot hold a replica's slot. An optional ``Tap`` sees each SSE chunk as
it passes.

``watched`` guards every step before a byte reached the client (``proxy/dispatch/forward.py`` sends and reads
under it): a replica failure is counted and a timed-out request abandoned. If the client goes away (the
handler is cancelled, or a write fails), the upstream connection is closed at once and
``POST /abort_request {"rid"}`` is sent in the background when the rid is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.context import Gateway
from proxy.dispatch.attempt import Attempt
from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from proxy.types import ParsedRequest, Route
from proxy.upstream.relay import ClientStalled, SSESniffer, end_body, first_event_error, relay_stream

log = logging.getLogger("kvroute.forward")


async def _first_chunk(gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse, parsed: ParsedRequest) -> bytes:
    """A stream's first chunk, by the attempt's deadline: until it came, the request can move on."""
    with watched(gw, a, resp, parsed):
        chunk = await gw.up.next_chunk(resp, a.replica, a.wait)
        if not chunk:
            raise UpstreamUnavailable("stream ended before its first byte", retryable=True)
        if (code := first_event_error(chunk)) is not None and code >= 500:
            raise UpstreamUnavailable(f"stream began with an error event ({code})", retryable=True)
    return chunk


@contextlib.contextmanager
def watched(
    gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse | None, parsed: ParsedRequest
) -> Iterator[None]:
    """Before a byte reached the client: a replica failure is counted (and a timed-out request
    abandoned), a client that left closes the upstream request; both propagate."""
    try:
        yield
    except UpstreamError as e:
        _upstream_failed(gw, a, e, resp, parsed.rid)
        raise
    except asyncio.CancelledError:
        _client_gone(gw, a, resp, parsed.rid, parsed.route.value)
        raise


async def relay_sse(
    request: web.Request,
    gw: Gateway,
    a: Attempt,
    resp: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    parsed: ParsedRequest,
    first: bytes | None = None,
) -> web.StreamResponse:
    """Relays ``resp``'s stream; ``first``: its first chunk, already read by the caller (a decode server's,
    read while its prefill server was watched too: ``proxy/disagg``)."""
    if first is None:
        first = await _first_chunk(gw, a, resp, parsed)
    out = web.StreamResponse(status=resp.status, headers=headers)
    await out.prepare(request)
    sniffer = SSESniffer()
    chunks = _prepend(first, gw.up.chunks(resp, a.replica, gw.deadlines.idle_s()))
    if a.tap is not None:
        chunks = a.tap.stream(resp.status, chunks)
    try:
        await relay_stream(out, chunks, sniffer, a.first_byte, gw.settings.client_write_timeout)
        if resp.status < 400 and parsed.route is not Route.PASSTHROUGH and not sniffer.saw_done:
            raise UpstreamUnavailable("stream ended before [DONE]", retryable=False)
        a.ok = resp.status < 400
        a.verdict = True if resp.status < 400 else a.verdict  # a 4xx is the client's (None)
    except UpstreamError as e:
        log.warning("stream from %s failed after its first byte: %s", a.replica, e.message)
        gw.metrics.stream_errors.labels(a.replica).inc()
        a.failed(e.code or "stream_error")
        _abandon(gw, a, resp, sniffer.rid or parsed.rid)
        await out.write(e.to_sse())  # then a clean end: the client's keep-alive connection stays usable
    except (asyncio.CancelledError, ConnectionResetError):
        _client_gone(gw, a, resp, sniffer.rid or parsed.rid, parsed.route.value)
        raise
    except ClientStalled as e:
        log.warning("client of a stream from %s stalled: %s; the request is aborted", a.replica, e)
        _client_gone(gw, a, resp, sniffer.rid or parsed.rid, parsed.route.value)  # not the replica's fault
        if request.transport is not None:
            request.transport.abort()
        return out
    finally:
        a.usage = sniffer.usage()
    await end_body(out)
    return out


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


def _upstream_failed(
    gw: Gateway, a: Attempt, e: UpstreamError, resp: aiohttp.ClientResponse | None, rid: str | None
) -> None:
    """The replica failed before a byte reached the client: counted; a timed-out request is abandoned."""
    gw.metrics.upstream_errors.labels(a.replica, e.code or "error").inc()
    a.failed(e.code or "upstream_error")
    if isinstance(e, UpstreamTimeout):
        log.warning("%s; trying another replica", e.message)
        _abandon(gw, a, resp, rid)


def _abandon(gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse | None, rid: str | None) -> None:
    """Closes the upstream connection now; asks the replica to abort ``rid`` in the background."""
    if resp is not None:
        resp.close()
    if rid is not None:
        gw.background.spawn(gw.up.abort(a.replica, rid))


def _client_gone(
    gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse | None, rid: str | None, route: str
) -> None:
    gw.metrics.disconnects.labels(route).inc()
    _abandon(gw, a, resp, rid)
