"""Sending one routed request upstream: attempts, retries, relay, outcome, abort.

For each replica in the ticket's ``decision.ranked`` order (``1 + retries`` attempts, cycling
through the list when it is shorter; a replica that refused the connection is not tried again):
1. a retry re-targets the ticket at its replica (``Router.retarget``: re-predicted and recorded there);
   take a load lease on the replica (its predicted uncached tokens count as prefill in flight);
2. send the client's exact body bytes; a connection that fails before any response byte, or a
   502/503/504 answer while another attempt remains, moves on to the next replica (counted);
   any other answer (2xx, 4xx, 500) is relayed as-is;
3. relay: whole body, or SSE chunk by chunk; a failure after the first streamed byte sends one SSE
   error event and closes (no ``[DONE]``);
4. ``finally``: release the lease, finish the ticket with the replica's ``Report`` (ok, usage, TTFT):
   the Router learns from it, or rolls back what never ran.
If the client goes away (the handler is cancelled, or a write fails), the upstream connection is
closed at once and ``POST /abort_request {"rid"}`` is sent in the background when the rid is known.
An optional ``Tap`` sees the relayed answer (the whole body, or each SSE chunk as it passes): the
response cache's capture (``proxy/response_capture.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.access_log import Access, access_of
from proxy.context import Gateway
from proxy.errors import NoReplicaAvailable, UpstreamError, UpstreamUnavailable, openai_error_body
from proxy.load import Work
from proxy.relay import SSESniffer, body_usage, forward_headers, relay_stream, response_headers
from proxy.types import ParsedRequest, Route, Usage
from routing.router import Ticket
from routing.types import Decision, ReplicaId, Report

log = logging.getLogger("kvroute.forward")
RETRY_STATUSES = frozenset({502, 503, 504})
ABORT_TIMEOUT_S = 2.0


class Tap(Protocol):
    """Sees the answer relayed to the client: a whole body, or the SSE chunks as they pass."""

    def body(self, status: int, body: bytes) -> None: ...

    def stream(self, status: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]: ...


class Attempt:
    """One try on one replica; collects what the outcome needs."""

    def __init__(self, gw: Gateway, ticket: Ticket, parsed: ParsedRequest, tap: Tap | None = None) -> None:
        self.gw, self.replica, self.route, self.tap = gw, ticket.replica, parsed.route.value, tap
        self.lease = gw.fleet.acquire(ticket.replica, _work(ticket, parsed))
        self.t0 = asyncio.get_running_loop().time()
        self.ttft: float | None = None
        self.usage = Usage()
        self.ok = False

    def first_byte(self) -> None:
        """First streamed byte: the prefill is done; this is the request's TTFT."""
        if self.ttft is None:
            self.ttft = asyncio.get_running_loop().time() - self.t0
            self.lease.first_token()

    def whole_body(self) -> None:
        """A non-streamed answer arrived: prefill and decode are done, so there is no TTFT to learn
        from (``ttft`` stays None rather than mixing decode time into prefill-rate learning)."""
        self.lease.first_token()


def _work(ticket: Ticket, parsed: ParsedRequest) -> Work:
    """The request's share of its replica's load: the predicted uncached tokens and seconds of prefill."""
    terms = ticket.prediction.terms
    return Work(
        sent_s=time.monotonic(),
        prefill_tokens=max(0, round(terms.uncached_tokens)),
        work_s=terms.prefill_s + terms.reload_s,
        ttft_s=terms.total,
        budget=ticket.request.max_new_tokens or 0,
        streamed=parsed.stream,
    )


def request_id(request: web.Request) -> str:
    return request.headers.get("x-request-id") or uuid.uuid4().hex


def _attempt_order(decision: Decision, retries: int) -> list[ReplicaId]:
    """``1 + retries`` attempts over the ranked replicas, cycling when there are fewer replicas (a
    single replica gets a second try after, e.g., a keep-alive connection it closed under us)."""
    ranked = [decision.replica, *(r for r in decision.ranked if r != decision.replica)]
    return [ranked[i % len(ranked)] for i in range(1 + retries)]


async def forward(
    request: web.Request,
    gw: Gateway,
    raw: bytes,
    parsed: ParsedRequest,
    ticket: Ticket,
    tap: Tap | None = None,
) -> web.StreamResponse:
    rid_header = request_id(request) if gw.settings.request_id_headers else None
    extra = {"x-request-id": rid_header} if rid_header else {}
    headers = forward_headers(request.headers, extra)
    last: UpstreamError | None = None
    access = access_of(request)
    order = _attempt_order(ticket.decision, gw.settings.retries)
    unreachable: set[ReplicaId] = set()
    for n, replica in enumerate(order):
        if replica in unreachable or gw.fleet.get(replica) is None:
            continue
        if n > 0:
            gw.metrics.retries.labels(replica).inc()
            ticket = gw.router.retarget(ticket, replica)
        attempt = Attempt(gw, ticket, parsed, tap)
        try:
            result = await _try(
                request, gw, attempt, raw, headers, parsed, rid_header, last_chance=n == len(order) - 1
            )
            if result is not None:
                return result
        except UpstreamError as e:
            if not e.retryable:
                raise
            last = e
            if isinstance(e, UpstreamUnavailable) and e.unreachable:
                unreachable.add(replica)
                gw.fleet.mark_unreachable(replica, e.message)
        finally:
            attempt.lease.release()
            _finish(gw, ticket, attempt, access)
    raise last or NoReplicaAvailable("no replica could take the request")


def _reported_cached(gw: Gateway, replica: ReplicaId, u: Usage) -> int | None:
    """SGLang 0.5.10 with ``--enable-cache-report`` sends ``prompt_tokens_details: null`` when nothing
    was cached: on such a replica a usage without details is a reported 0, not "unknown"."""
    if u.cached_tokens is not None or u.prompt_tokens is None:
        return u.cached_tokens
    r = gw.fleet.get(replica)
    return 0 if r is not None and r.info is not None and r.info.cache_report else None


def _finish(gw: Gateway, ticket: Ticket, a: Attempt, access: Access) -> None:
    u = dataclasses.replace(a.usage, cached_tokens=_reported_cached(gw, a.replica, a.usage))
    elapsed = asyncio.get_running_loop().time() - a.t0
    decode = elapsed - a.ttft if a.ttft is not None else None
    report = Report(a.ok, u.prompt_tokens, u.cached_tokens, a.ttft, u.completion_tokens, decode)
    gw.router.finish(ticket, report)
    gw.metrics.attempt_done(a.route, ticket, report, elapsed)
    access.replica, access.reason, access.ttft_s = a.replica, ticket.decision.reason.value, a.ttft
    access.prompt_tokens, access.cached_tokens = u.prompt_tokens, u.cached_tokens
    access.completion_tokens, access.attempts = u.completion_tokens, access.attempts + 1


async def _try(
    request: web.Request,
    gw: Gateway,
    a: Attempt,
    raw: bytes,
    headers: CIMultiDict[str],
    parsed: ParsedRequest,
    rid_header: str | None,
    last_chance: bool,
) -> web.StreamResponse | None:
    """Returns the relayed response, or None to try the next replica; raises UpstreamError."""
    try:
        resp = await gw.up.send(a.replica, request.method, request.path_qs, headers, raw or None)
    except UpstreamError as e:
        gw.metrics.upstream_errors.labels(a.replica, e.code or "error").inc()
        raise
    except asyncio.CancelledError:
        _client_gone(gw, a, None, parsed.rid, parsed.route.value)
        raise
    try:
        if resp.status in RETRY_STATUSES and not last_chance:
            gw.metrics.upstream_errors.labels(a.replica, f"http_{resp.status}").inc()
            return None
        extra = {"x-request-id": rid_header, "x-kvroute-replica": a.replica} if rid_header else {}
        out_headers = response_headers(resp.headers, extra)
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await _relay_sse(request, gw, a, resp, out_headers, parsed)
        try:
            body = await gw.up.read(resp)
        except asyncio.CancelledError:
            _client_gone(gw, a, resp, parsed.rid, parsed.route.value)
            raise
        a.whole_body()
        a.ok = resp.status < 400
        a.usage = body_usage(body) if a.ok else Usage()
        if a.tap is not None:
            a.tap.body(resp.status, body)
        reshaped = openai_error_body(resp.status, body) if parsed.route is Route.PASSTHROUGH else None
        if reshaped is not None:
            body, out_headers["Content-Type"] = reshaped, "application/json"
        return web.Response(status=resp.status, body=body, headers=out_headers)
    finally:
        resp.release()


async def _relay_sse(
    request: web.Request,
    gw: Gateway,
    a: Attempt,
    resp: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    parsed: ParsedRequest,
) -> web.StreamResponse:
    out = web.StreamResponse(status=resp.status, headers=headers)
    await out.prepare(request)
    sniffer = SSESniffer()
    chunks = gw.up.chunks(resp) if a.tap is None else a.tap.stream(resp.status, gw.up.chunks(resp))
    try:
        await relay_stream(out, chunks, sniffer, a.first_byte)
        a.ok = resp.status < 400
    except UpstreamError as e:
        log.warning("stream from %s failed after its first byte: %s", a.replica, e.message)
        gw.metrics.stream_errors.labels(a.replica).inc()
        out.force_close()
        await out.write(e.to_sse())
    except (asyncio.CancelledError, ConnectionResetError):
        _client_gone(gw, a, resp, sniffer.rid or parsed.rid, parsed.route.value)
        raise
    finally:
        a.usage = sniffer.usage()
    await out.write_eof()
    return out


def _client_gone(
    gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse | None, rid: str | None, route: str
) -> None:
    """Closes the upstream connection now; asks the replica to abort ``rid`` in the background."""
    if resp is not None:
        resp.close()
    gw.metrics.disconnects.labels(route).inc()
    if rid is not None:
        gw.background.spawn(_abort(gw, a.replica, rid))


async def _abort(gw: Gateway, replica: ReplicaId, rid: str) -> None:
    try:
        await gw.up.call(replica, "POST", "/abort_request", ABORT_TIMEOUT_S, json={"rid": rid})
    except UpstreamError as e:
        log.info("abort of a request on %s failed: %s", replica, e.message)
