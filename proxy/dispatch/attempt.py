"""One try of a routed request on one replica: its load lease, its deadline, what it met, its report.

An ``Attempt`` takes a load lease on its replica (the predicted uncached tokens count as prefill in
flight until the first byte), fixes the loop time by which its first byte must arrive
(``proxy/upstream/deadlines.py``, from the ticket's predicted TTFT), and collects what the outcome needs:
TTFT, usage, ``ok`` (an answer < 400, for the Router) and ``verdict`` (for the replica's circuit breaker:
True for an answer < 400, False for a 5xx, a connection error, a timeout or a cut stream, None for a
4xx, the client's bad request, and when the client left first). ``finish`` ends it exactly once: the
lease is released, the Router learns from the replica's ``Report`` (or rolls back what never ran), the
metrics and the access log see it, and the breaker gets the verdict.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Protocol

from aiohttp import web

from proxy.context import Gateway
from proxy.fleet.load import Work
from proxy.observe.access_log import Access
from proxy.types import ParsedRequest, Usage
from proxy.upstream.liveness import FirstByteWait, always
from routing.ledger import Ticket
from routing.ttft import kv_need
from routing.types import ReplicaId, Report

OVERTAKEN = 3  # overtakes that mark a waiting request as stuck (``Attempt._stuck``)


class Tap(Protocol):
    """Sees the answer relayed to the client: a whole body, or the SSE chunks as they pass."""

    def body(self, status: int, body: bytes) -> None: ...

    def stream(self, status: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]: ...


class Attempt:
    """One try on one replica; collects what the outcome needs."""

    def __init__(self, gw: Gateway, ticket: Ticket, parsed: ParsedRequest, tap: Tap | None = None) -> None:
        first_byte_s = gw.deadlines.first_byte_s(
            ticket.prediction.terms.total, parsed.stream, ticket.request.max_new_tokens
        )
        work = work_of(ticket, parsed, gw.router.cfg.default_new_tokens, first_byte_s)
        self._start(gw, ticket, ticket.replica, work, parsed, tap)

    def _start(
        self,
        gw: Gateway,
        ticket: Ticket,
        replica: ReplicaId,
        work: Work,
        parsed: ParsedRequest,
        tap: Tap | None,
    ) -> None:
        """The lease on ``replica`` and the first-byte deadline of ``work`` (a subclass may lease another
        replica than the ticket's: the decode server of a prefill/decode pair, ``proxy/disagg``)."""
        self.gw, self.ticket, self.replica, self.tap = gw, ticket, replica, tap
        self.route = parsed.route.value
        first_byte_s = work.first_byte_s
        self.lease = gw.fleet.acquire(replica, work)
        self.t0 = asyncio.get_running_loop().time()
        self.deadline = self.t0 + first_byte_s
        # the first-byte wait of its send and first chunk: never past request_timeout from now; an answer
        # that is not streamed never waits on past its deadline (``_stuck``)
        stuck = self._stuck if parsed.stream else always
        self.wait = FirstByteWait(self.deadline, self.t0 + gw.deadlines.request_timeout, stuck)
        self.ttft: float | None = None
        self.answered_s: float | None = None  # a whole (non-streamed) answer: when it arrived
        self.usage = Usage()
        self.ok = False
        self.verdict: bool | None = None
        self.failure = ""
        self.answer: web.Response | None = None  # a 5xx answer retried elsewhere (proxy/dispatch/forward.py)
        self.suspect = False  # answered 5xx: blamed only if another replica then does better

    def _stuck(self) -> bool:
        """Overtaken ``OVERTAKEN`` times on a replica that starts prefills in arrival order: the request is
        not queued there (proxy/fleet/load.py), so a working replica is no reason to wait on for it.

        A request whose answer is not streamed has no such evidence (its only byte is the whole answer,
        and later requests with shorter answers finish first as a rule), and needs no wait beyond its
        deadline, which already adds ``max_tokens x decode_timeout_per_token`` (or is ``request_timeout``
        without a ``max_tokens``): it is always "stuck", so a replica that lost it while it serves others
        cannot keep it until ``request_timeout``."""
        info = self.lease.replica.info
        return self.lease.work.overtaken >= OVERTAKEN and info is not None and info.in_send_order

    def first_byte(self) -> None:
        """First streamed byte: the prefill is done; this is the request's TTFT."""
        if self.ttft is None:
            self.ttft = asyncio.get_running_loop().time() - self.t0
            self.lease.first_token()

    def whole_body(self) -> None:
        """A non-streamed answer arrived: prefill and decode are done, so there is no TTFT to learn
        from (``ttft`` stays None rather than mixing decode time into prefill-rate learning); the access
        log shows when it arrived."""
        self.answered_s = asyncio.get_running_loop().time() - self.t0
        self.lease.first_token()

    def failed(self, reason: str) -> None:
        """The replica failed this attempt (the breaker counts it)."""
        self.verdict, self.failure = False, reason

    def suspected(self, reason: str) -> None:
        """The replica answered 5xx: the breaker counts it only once another replica answered the same
        request well (``proxy/dispatch/forward.py``); a body that every replica fails on blames none of
        them."""
        self.verdict, self.failure, self.suspect = None, reason, True

    def finish(self, access: Access) -> None:
        self.lease.release()
        gw, a = self.gw, self
        u = dataclasses.replace(a.usage, cached_tokens=_reported_cached(gw, a.replica, a.usage))
        elapsed = asyncio.get_running_loop().time() - a.t0
        decode = elapsed - a.ttft if a.ttft is not None else None
        report = Report(a.ok, u.prompt_tokens, u.cached_tokens, a.ttft, u.completion_tokens, decode)
        gw.router.finish(a.ticket, report)
        gw.metrics.attempt_done(a.route, a.ticket, report, elapsed)
        access.replica, access.reason = a.replica, a.ticket.decision.reason.value
        access.ttft_s = a.ttft if a.ttft is not None else a.answered_s
        access.prompt_tokens, access.cached_tokens = u.prompt_tokens, u.cached_tokens
        access.completion_tokens, access.attempts = u.completion_tokens, access.attempts + 1
        gw.fleet.outcome(a.replica, a.verdict, a.failure)


def work_of(ticket: Ticket, parsed: ParsedRequest, default_tokens: int, first_byte_s: float) -> Work:
    """The request's share of its replica's load: the predicted uncached tokens and seconds of prefill,
    the KV it holds, and its first-byte deadline."""
    terms = ticket.prediction.terms
    return Work(
        sent_s=time.monotonic(),
        prefill_tokens=max(0, round(terms.uncached_tokens)),
        work_s=terms.prefill_s + terms.reload_s,
        ttft_s=terms.total,
        budget=ticket.request.max_new_tokens or 0,
        streamed=parsed.stream,
        overhead_s=terms.overhead_s,
        reload_s=terms.reload_s,
        kv_tokens=round(kv_need(ticket.request, terms.uncached_tokens, default_tokens)),
        first_byte_s=first_byte_s,
    )


def _reported_cached(gw: Gateway, replica: ReplicaId, u: Usage) -> int | None:
    """SGLang 0.5.10 with ``--enable-cache-report`` sends ``prompt_tokens_details: null`` when nothing
    was cached: on such a replica a usage without details is a reported 0, not "unknown"."""
    if u.cached_tokens is not None or u.prompt_tokens is None:
        return u.cached_tokens
    r = gw.fleet.get(replica)
    return 0 if r is not None and r.info is not None and r.info.cache_report else None
