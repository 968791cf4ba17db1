"""Sending one routed request upstream: attempts, retries, relay, outcome, abort.

For each replica in the ticket's ``decision.ranked`` order (``1 + retries`` attempts, cycling
through the list when it is shorter; a replica that refused the connection is not tried again, one
whose circuit breaker refuses (``Fleet.admit``: open, or its half-open trial already out) is skipped):
1. a retry re-targets the ticket at its replica (``Router.retarget``: re-predicted and recorded there);
   it must fit the retry budget and waits a jittered backoff first (``proxy/upstream/retry_budget.py``);
   the ``Attempt`` (``proxy/dispatch/attempt.py``) takes a load lease and fixes its first-byte deadline;
2. send the client's exact body bytes; any failure before a byte reached the client moves on to the
   next replica (counted): a connection error, a 500/502/503/504 answer while another attempt remains,
   no first byte by the deadline (the replica is asked to abort the rid, when known, and the
   connection is closed), a body or a stream's first chunk that fails, a stream whose first event is
   an in-band 5xx error (SGLang's way to fail a request it already accepted, e.g. while restarting);
   any other answer is relayed (an error in another shape than OpenAI's re-shaped, except on
   ``/generate``);
3. relay: the whole body here, or SSE chunk by chunk (``proxy/dispatch/stream_relay.py``, which also says what
   a failure after the first streamed byte does);
4. ``finally``: ``Attempt.finish`` (lease, Router report, metrics, the breaker's verdict).
A request whose ticket names a prefill server of a prefill/decode fleet goes to the app's ``PAIRS``
instead (``proxy/disagg``: the prefill and a decode server at once, one stream back).
If the client goes away, the upstream connection is closed and the rid aborted
(``proxy/dispatch/stream_relay.py``). An optional ``Tap`` sees the relayed answer (the whole body, or each SSE
chunk as it passes): the response cache's capture (``proxy/answers/capture.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.context import Gateway
from proxy.dispatch.attempt import Attempt, Tap
from proxy.dispatch.stream_relay import relay_sse, watched
from proxy.errors import NoReplicaAvailable, UpstreamError, UpstreamUnavailable, openai_error_body
from proxy.observe.access_log import access_of
from proxy.types import ParsedRequest, Route
from proxy.upstream.relay import body_usage, forward_headers, response_headers
from proxy.upstream.retry_budget import backoff_s
from routing.ledger import Ticket
from routing.types import Decision, ReplicaId

__all__ = ["PAIRS", "PairForward", "Tap", "forward", "request_id"]
RETRY_STATUSES = frozenset({500, 502, 503, 504})


class PairForward(Protocol):
    """Sends a request whose ticket names a prefill server to a prefill/decode pair (``proxy/disagg``)."""

    def serves(self, ticket: Ticket) -> bool: ...

    async def forward(
        self, request: web.Request, raw: bytes, parsed: ParsedRequest, ticket: Ticket, tap: Tap | None
    ) -> web.StreamResponse: ...


PAIRS: web.AppKey[PairForward] = web.AppKey("pairs", PairForward)


def request_id(request: web.Request) -> str:
    return request.headers.get("x-request-id") or uuid.uuid4().hex


def upstream_target(request: web.Request, parsed: ParsedRequest) -> str:
    """The route's own path and the client's raw query: never the client's spelling of the path."""
    _, sep, query = request.raw_path.partition("?")
    return parsed.upstream_path + sep + query


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
    pairs = request.app.get(PAIRS)
    if pairs is not None and pairs.serves(ticket):
        return await pairs.forward(request, raw, parsed, ticket, tap)
    rid_header = request_id(request) if gw.settings.request_id_headers else None
    extra = {"x-request-id": rid_header} if rid_header else {}
    headers = forward_headers(request.headers, extra)
    last: UpstreamError | None = None
    access = access_of(request)
    order = _attempt_order(ticket.decision, gw.settings.retries)
    unreachable: set[ReplicaId] = set()
    gw.retry_budget.request(time.monotonic())
    retried = 0
    answered: web.Response | None = None  # the last 5xx a replica answered (relayed if nothing better)
    suspects: list[tuple[ReplicaId, str]] = []  # replicas that answered it 5xx (proxy/dispatch/attempt.py)
    for n, replica in enumerate(order):
        if replica in unreachable or not gw.fleet.admits(replica):
            continue
        if last is not None:
            if not _before_retry(gw, parsed, replica):
                break
            await asyncio.sleep(backoff_s(retried, gw.settings.retry_backoff, gw.settings.retry_backoff_max))
            retried += 1
        if not gw.fleet.admit(replica):  # claimed last: nothing between here and the attempt can fail
            continue
        if replica != ticket.replica:
            ticket = gw.router.retarget(ticket, replica)
        attempt = Attempt(gw, ticket, parsed, tap)
        try:
            result = await _try(
                request, gw, attempt, raw, headers, parsed, rid_header, can_retry=n < len(order) - 1
            )
            if result is not None:
                _blame(gw, suspects, result.status)
                return result
            answered = attempt.answer or answered
            last = UpstreamUnavailable(f"replica {replica}: {attempt.failure}", retryable=True)
        except UpstreamError as e:
            if not e.retryable:
                raise
            last = e
            if isinstance(e, UpstreamUnavailable) and e.unreachable:
                unreachable.add(replica)
                gw.fleet.mark_unreachable(replica, e.message)
        finally:
            attempt.finish(access)
            if attempt.suspect:
                suspects.append((replica, attempt.failure))
    if answered is not None:  # no replica did better: the client gets the replica's own answer
        return answered
    raise last or NoReplicaAvailable("no replica could take the request")


def _blame(gw: Gateway, suspects: list[tuple[ReplicaId, str]], status: int) -> None:
    """Another replica answered well (below 400): the 5xx answers before it were the replicas' fault. A
    4xx says the request is bad, and it may be what made them fail: nobody is blamed."""
    if status < 400:
        for replica, reason in suspects:
            gw.fleet.outcome(replica, False, reason)


def _before_retry(gw: Gateway, parsed: ParsedRequest, replica: ReplicaId) -> bool:
    """Spends one retry of the budget; False (counted) when the budget has none left."""
    if not gw.retry_budget.spend(time.monotonic()):
        gw.metrics.retry_budget_exhausted.labels(parsed.route.value).inc()
        return False
    gw.metrics.retries.labels(replica).inc()
    return True


async def _try(
    request: web.Request,
    gw: Gateway,
    a: Attempt,
    raw: bytes,
    headers: CIMultiDict[str],
    parsed: ParsedRequest,
    rid_header: str | None,
    can_retry: bool,
) -> web.StreamResponse | None:
    """Returns the relayed response, or None to try the next replica; raises UpstreamError."""
    with watched(gw, a, None, parsed):
        resp = await gw.up.send(
            a.replica, request.method, upstream_target(request, parsed), headers, raw or None, a.wait
        )
    try:
        if resp.status >= 500:
            a.suspected(f"HTTP {resp.status}")
            gw.metrics.upstream_errors.labels(a.replica, f"http_{resp.status}").inc()
            if resp.status in RETRY_STATUSES and can_retry and _budget_allows(gw, parsed):
                a.answer = await _kept_answer(gw, a, resp, rid_header, parsed.route)
                return None
        extra = {"x-request-id": rid_header, "x-kvroute-replica": a.replica} if rid_header else {}
        out_headers = response_headers(resp.headers, extra)
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await relay_sse(request, gw, a, resp, out_headers, parsed)
        with watched(gw, a, resp, parsed):
            body = await gw.up.read(resp, a.replica, a.wait)
        a.whole_body()
        a.ok = resp.status < 400
        if a.ok:
            a.verdict = True  # a 4xx is the client's: it says nothing of the replica (verdict None)
        a.usage = body_usage(body) if a.ok else a.usage
        if a.tap is not None:
            a.tap.body(resp.status, body)
        return _answer(resp.status, body, out_headers, parsed.route)
    finally:
        resp.release()


def _answer(status: int, body: bytes, headers: CIMultiDict[str], route: Route) -> web.Response:
    """A replica's whole answer as relayed: an error in another shape than OpenAI's (SGLang's flat
    ``{"object": "error", ...}``, FastAPI's ``detail``, text) re-shaped on the OpenAI routes; ``/generate``
    keeps SGLang's native errors."""
    reshaped = openai_error_body(status, body) if route is not Route.GENERATE else None
    if reshaped is not None:
        body, headers["Content-Type"] = reshaped, "application/json"
    return web.Response(status=status, body=body, headers=headers)


async def _kept_answer(
    gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse, rid_header: str | None, route: Route
) -> web.Response | None:
    """A replica's 5xx answer that is retried elsewhere, kept to relay should no replica do better
    (None when its body cannot be read)."""
    try:
        body = await gw.up.read(resp, a.replica, a.wait)
    except UpstreamError:
        return None
    extra = {"x-request-id": rid_header, "x-kvroute-replica": a.replica} if rid_header else {}
    return _answer(resp.status, body, response_headers(resp.headers, extra), route)


def _budget_allows(gw: Gateway, parsed: ParsedRequest) -> bool:
    """Is a retry possible? If not, the replica's own 5xx answer is relayed (the refusal counted)."""
    if gw.retry_budget.has_room(time.monotonic()):
        return True
    gw.retry_budget.refused()
    gw.metrics.retry_budget_exhausted.labels(parsed.route.value).inc()
    return False
