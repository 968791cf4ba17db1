"""One try of a request on one prefill/decode pair: both sent at once, the decode relayed from its first byte.

1. A fresh room; both servers get the same body (``proxy/disagg/bootstrap.py``), path and forwarded headers,
   sent concurrently as two tasks started together: a lone side would block, since a prefill holds the
   request until its decode has registered the room (pd-contract.md §2.3).
2. Until the decode's first byte (a stream's first chunk, or a whole answer) both are watched:
   - the prefill fails first (a connection error, a timeout, a 5xx answer, a stream that begins with a 5xx
     error event): the decode's request is given up and the pair failed (retried elsewhere); a 4xx answer
     of the prefill is the client's answer, the decode given up;
   - the decode fails first (the same failures): the prefill's request is given up and the pair failed;
     a decode that refused the connection is out of the pool until its next good health check;
   - the decode answers below 500: it is relayed, and the prefill left to finish (its answer ends once its
     KV went over, before the decode's first token).
   A side given up has its connection closed, which aborts the request there (SGLang aborts on a
   disconnect; a decode waiting for the room's KV fails, a prefill holding the room releases it). The side
   that failed first is the one its circuit breaker hears of (a 5xx answer only once another pair
   answered the same request well, as ``proxy/dispatch/forward.py`` judges one replica's 5xx).
3. The decode's stream is relayed byte for byte from its first chunk (``proxy/dispatch/stream_relay.py``:
   also a failure after that byte, and a client that stalls); a whole answer is sent as it came. The
   headers are the decode's, plus ``x-kvroute-replica`` (the decode server) and ``x-kvroute-prefill`` when
   request-id headers are on. The prefill's answer is then awaited (its usage is the ticket's report).
A client that leaves (its handler cancelled) closes both connections at once, and both servers are asked
to abort the client's ``rid`` when it gave one. ``finish`` ends both attempts exactly once.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from multidict import CIMultiDict

from proxy.context import Gateway
from proxy.disagg.bootstrap import pair_body
from proxy.disagg.legs import (
    DecodeAttempt,
    DecodeHead,
    PrefillAnswer,
    PrefillAttempt,
    decode_head,
    prefill_leg,
)
from proxy.dispatch.attempt import Attempt, Tap
from proxy.dispatch.forward import upstream_target
from proxy.dispatch.stream_relay import relay_sse
from proxy.errors import UpstreamError, UpstreamUnavailable
from proxy.observe.access_log import Access
from proxy.types import ParsedRequest
from proxy.upstream.relay import body_usage, response_headers
from routing.decode_placement import DecodeCost
from routing.ledger import Ticket

Side = str  # "prefill" or "decode"


class PairFailed(Exception):
    """The pair failed before the client got a byte: ``side`` failed first (retry on another pair)."""

    def __init__(self, side: Side, error: UpstreamError) -> None:
        super().__init__(error.message)
        self.side, self.error = side, error


class Pair:
    """See the module docstring."""

    def __init__(
        self, gw: Gateway, ticket: Ticket, choice: DecodeCost, parsed: ParsedRequest, tap: Tap | None
    ) -> None:
        self.gw, self.parsed = gw, parsed
        self.prefill = PrefillAttempt(gw, ticket, parsed)
        self.decode = DecodeAttempt(gw, ticket, choice, parsed, tap)
        self.rooms: list[int] = []
        self.answer: web.Response | None = None  # a side's 5xx answer, relayed if no pair does better
        self.suspect: Attempt | None = None  # the side that answered it

    async def run(
        self, request: web.Request, raw: bytes, headers: CIMultiDict[str], rid: str | None
    ) -> web.StreamResponse:
        """The client's answer; raises PairFailed, a non-retryable UpstreamError, or CancelledError."""
        gw, p, d = self.gw, self.prefill, self.decode
        replica = gw.fleet.get(p.replica)
        body, self.rooms = pair_body(raw, self.parsed, p.replica, replica.bootstrap_port if replica else None)
        target = upstream_target(request, self.parsed)
        loop = asyncio.get_running_loop()
        p_task = loop.create_task(prefill_leg(gw, p, target, headers, body))
        d_task = loop.create_task(decode_head(gw, d, target, headers, body))
        relaying = False
        try:
            decided = await self._decided(p_task, d_task)
            if isinstance(decided, web.Response):
                return decided
            relaying = True
            return await self._relay(request, decided, p_task, rid)
        except asyncio.CancelledError:
            self._client_gone(counted=relaying)
            raise
        finally:
            await _settle(p_task, d_task)
            if not relaying and d_task.done() and not d_task.cancelled() and d_task.exception() is None:
                d_task.result().resp.close()  # a decode answer that the client does not get

    async def _decided(
        self, p_task: asyncio.Task[PrefillAnswer], d_task: asyncio.Task[DecodeHead]
    ) -> DecodeHead | web.Response:
        pending: set[asyncio.Task[PrefillAnswer] | asyncio.Task[DecodeHead]] = {p_task, d_task}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if p_task in done and (answer := self._judge_prefill(p_task)) is not None:
                return answer
            if d_task in done:
                return self._judge_decode(d_task)

    def _judge_prefill(self, task: asyncio.Task[PrefillAnswer]) -> web.Response | None:
        """None when the prefill answered well; its 4xx answer for the client; raises PairFailed."""
        p = self.prefill
        self._raise_failure("prefill", p, task)
        answer = task.result()
        if not answer.failed:
            return None
        kept = web.Response(
            status=answer.status, body=answer.body, headers=response_headers(answer.headers, {})
        )
        if not answer.retryable:
            return kept
        self._suspect(
            p, kept, f"HTTP {answer.status}" if answer.status >= 500 else f"error event {answer.error}"
        )
        raise PairFailed("prefill", UpstreamUnavailable(f"prefill {p.replica}: {p.failure}", retryable=True))

    def _judge_decode(self, task: asyncio.Task[DecodeHead]) -> DecodeHead:
        d = self.decode
        self._raise_failure("decode", d, task)
        head = task.result()
        if head.retryable:
            kept = None
            if head.first is None:
                kept = web.Response(
                    status=head.resp.status, body=head.body, headers=response_headers(head.resp.headers, {})
                )
            head.resp.close()
            status = head.resp.status
            self._suspect(d, kept, f"HTTP {status}" if status >= 500 else f"error event {head.error}")
            raise PairFailed(
                "decode", UpstreamUnavailable(f"decode {d.replica}: {d.failure}", retryable=True)
            )
        return head

    def _raise_failure(
        self, side: Side, a: Attempt, task: asyncio.Task[PrefillAnswer] | asyncio.Task[DecodeHead]
    ) -> None:
        """A side whose request failed (connection, deadline): counted, its breaker told; PairFailed."""
        e = task.exception()
        if e is None:
            return
        if not isinstance(e, UpstreamError):
            raise e
        self.gw.metrics.upstream_errors.labels(a.replica, e.code or "error").inc()
        a.failed(e.code or "upstream_error")
        if isinstance(e, UpstreamUnavailable) and e.unreachable:
            self.gw.fleet.mark_unreachable(a.replica, e.message)
        raise PairFailed(side, e)

    def _suspect(self, a: Attempt, kept: web.Response | None, reason: str) -> None:
        a.suspected(reason)
        self.answer, self.suspect = kept or self.answer, a

    async def _relay(
        self, request: web.Request, head: DecodeHead, p_task: asyncio.Task[PrefillAnswer], rid: str | None
    ) -> web.StreamResponse:
        gw, d, resp = self.gw, self.decode, head.resp
        extra = {} if rid is None else {"x-request-id": rid, "x-kvroute-replica": d.replica}
        if rid is not None:
            extra["x-kvroute-prefill"] = self.prefill.replica
        out_headers = response_headers(resp.headers, extra)
        if head.first is not None:
            out: web.StreamResponse = await relay_sse(
                request, gw, d, resp, out_headers, self.parsed, head.first
            )
        else:
            resp.release()
            d.whole_body()
            d.ok = resp.status < 400
            d.verdict = True
            d.usage = body_usage(head.body) if d.ok else d.usage
            if d.tap is not None:
                d.tap.body(resp.status, head.body)
            out = web.Response(status=resp.status, body=head.body, headers=out_headers)
        if resp.status < 400 and head.error is None and not p_task.done():
            await asyncio.wait({p_task})  # it ends with the transfer, before the decode's first token
        return out

    def _client_gone(self, counted: bool) -> None:
        """The client left: both requests are given up (the decode's relay already counted it and
        aborted the decode's request once it had begun)."""
        gw, rid = self.gw, self.parsed.rid
        if not counted:
            gw.metrics.disconnects.labels(self.parsed.route.value).inc()
        if rid is not None:
            for a in (self.prefill,) if counted else (self.prefill, self.decode):
                gw.background.spawn(gw.up.abort(a.replica, rid))

    def finish(self, access: Access) -> None:
        self.prefill.finish(access)
        self.decode.finish(access)


async def _settle(*tasks: asyncio.Task[PrefillAnswer] | asyncio.Task[DecodeHead]) -> None:
    """Gives up what is still running (its connection closed) and collects every outcome. Nothing is
    awaited when both are done: a client that leaves as soon as it read its answer's last event must not
    cancel the handler after its answer was given."""
    running = [t for t in tasks if not t.done()]
    for t in running:
        t.cancel()
    if running:
        await asyncio.wait(running)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: an outcome nobody needs is not "never retrieved"
