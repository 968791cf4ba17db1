"""The two sides of one pair attempt: the prefill server's leg and the decode server's attempt.

``prefill_leg`` sends the pair's body to the prefill server under its ``Attempt``
(``proxy/dispatch/attempt.py``: the Router's ticket, a load lease, a first-byte deadline) and reads its
whole answer, streamed or not: a prefill answers with one token once the KV reached the decode
(pd-contract.md §2.3). Its usage is the ticket's report, so the prompt and cached tokens the Router
learns from are the prefill's own (§2.5); its first byte frees its load lease's queued prefill but is no
TTFT the Router learns rates from: it comes after the decode admitted the request and after the KV
transfer, neither of which is the prefill's work. A stream cut after
that byte no longer matters to the pair (the KV went over): the prefill's breaker counts it, the pair goes
on. ``PrefillAnswer`` keeps the bytes, so a prefill's error answer can be relayed as it was.

Both sides' first bytes wait up to ``--request-timeout``, as sglang-router's do (it has no shorter
deadline): a pair's first byte waits for the decode server to admit the request (its KV memory, which
requests waiting for other prefills hold too) and for the KV transfer, which no prediction of the
prefill's bounds, and a deadline shorter than a busy fleet's wait would abort and resend the waiting
requests, making the wait longer. A server that dies is found by its connection (reset, refused) and
by the health checks; a failure it answers with (a 5xx, an error event) ends the pair at once.

``PrefillAttempt`` is that ``Attempt`` on the pair's prefill server, with the Router's ticket.
``DecodeAttempt`` is an ``Attempt`` on the pair's decode server: its lease counts the prompt's KV as
pending until the first byte, and as KV held the prompt plus its reservation (the larger of SGLang's
``--num-reserved-decode-tokens`` and the output budget, ``routing.decode_placement``); its predicted
TTFT is the prefill's plus the decode's predicted wait and transfer; its TTFT is the client's. It has
no Router ticket of its own (the prefill's attempt finishes that): ``finish`` releases the lease,
records the decode server's TTFT and duration, tells the access log the TTFT the client saw and gives
the decode's breaker its verdict.
``decode_head`` sends to it and reads what decides whether the pair goes on: a stream's first chunk, or
a whole answer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from proxy.context import Gateway
from proxy.dispatch.attempt import Attempt, Tap, work_of
from proxy.errors import UpstreamError, UpstreamUnavailable
from proxy.fleet.load import Work
from proxy.observe.access_log import Access
from proxy.types import ParsedRequest
from proxy.upstream.relay import SSESniffer, body_usage, first_event_error
from routing.decode_placement import DecodeCost
from routing.ledger import Ticket
from routing.ttft import CLIP_OUTPUT_TOKENS

SSE = "text/event-stream"


@dataclass(frozen=True, slots=True)
class PrefillAnswer:
    status: int
    headers: CIMultiDict[str]
    body: bytes
    error: int | None = None  # the code of an in-band error its stream began with

    @property
    def failed(self) -> bool:
        return self.status >= 400 or self.error is not None

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or (self.error or 0) >= 500


@dataclass(frozen=True, slots=True)
class DecodeHead:
    resp: aiohttp.ClientResponse
    first: bytes | None  # a stream's first chunk (None: a whole answer, in ``body``)
    body: bytes = b""
    error: int | None = None  # the code of an in-band error its stream began with

    @property
    def retryable(self) -> bool:
        return self.resp.status >= 500 or (self.error or 0) >= 500


def _is_sse(resp: aiohttp.ClientResponse) -> bool:
    return resp.status < 400 and resp.headers.get("Content-Type", "").startswith(SSE)


async def prefill_leg(
    gw: Gateway, a: Attempt, target: str, headers: CIMultiDict[str], body: bytes
) -> PrefillAnswer:
    """The prefill server's whole answer (module docstring); raises UpstreamError before its first byte."""
    resp = await gw.up.send(a.replica, "POST", target, headers, body, a.wait)
    try:
        if _is_sse(resp):
            data = await _stream(gw, a, resp)
            answer = PrefillAnswer(resp.status, CIMultiDict(resp.headers), data, first_event_error(data))
        else:
            data = await gw.up.read(resp, a.replica, a.wait)
            a.whole_body()
            a.usage = body_usage(data) if resp.status < 400 else a.usage
            answer = PrefillAnswer(resp.status, CIMultiDict(resp.headers), data)
        a.ok = not answer.failed
        if answer.status < 500 and not answer.retryable and a.verdict is None:
            a.verdict = True
        return answer
    except asyncio.CancelledError:
        resp.close()  # the pair gave it up (or the client left): the server aborts the request
        raise
    finally:
        resp.release()


async def _stream(gw: Gateway, a: Attempt, resp: aiohttp.ClientResponse) -> bytes:
    first = await gw.up.next_chunk(resp, a.replica, a.wait)
    if not first:
        raise UpstreamUnavailable("the prefill's stream ended before its first byte", retryable=True)
    a.lease.first_token()  # no TTFT to learn rates from: it holds the decode's admission and the transfer
    sniffer, chunks = SSESniffer(), [first]
    sniffer.feed(first)
    try:
        async for chunk in gw.up.chunks(resp, a.replica, gw.deadlines.idle_s()):
            sniffer.feed(chunk)
            chunks.append(chunk)
    except UpstreamError as e:  # after its token: the KV went over, the pair goes on
        a.failed(e.code or "stream_error")
    a.usage = sniffer.usage()
    return b"".join(chunks)


class PrefillAttempt(Attempt):
    """The Router's ticket on the pair's prefill server; its first byte waits up to the request timeout."""

    def __init__(self, gw: Gateway, ticket: Ticket, parsed: ParsedRequest) -> None:
        work = work_of(ticket, parsed, gw.router.cfg.default_new_tokens, gw.deadlines.request_timeout)
        self._start(gw, ticket, ticket.replica, work, parsed, None)


class DecodeAttempt(Attempt):
    """See the module docstring."""

    def __init__(
        self, gw: Gateway, ticket: Ticket, choice: DecodeCost, parsed: ParsedRequest, tap: Tap | None
    ) -> None:
        budget = ticket.request.max_new_tokens
        predicted = ticket.prediction.terms.total + choice.wait_s + choice.transfer_s
        first_byte_s = gw.deadlines.request_timeout
        prompt = ticket.request.prompt_tokens
        cfg = gw.router.cfg
        reserve = max(cfg.decode_reserved_tokens, min(budget or cfg.default_new_tokens, CLIP_OUTPUT_TOKENS))
        held = prompt + reserve
        work = Work(
            sent_s=time.monotonic(), prefill_tokens=round(prompt), work_s=choice.transfer_s,
            ttft_s=predicted, budget=budget or 0, streamed=parsed.stream, kv_tokens=round(held),
            first_byte_s=first_byte_s,
        )  # fmt: skip
        self._start(gw, ticket, choice.replica, work, parsed, tap)

    def finish(self, access: Access) -> None:
        self.lease.release()
        elapsed = asyncio.get_running_loop().time() - self.t0
        ttft, duration = self.gw.metrics.ttft[1], self.gw.metrics.duration[1]
        if self.ttft is not None:
            ttft.observe(self.ttft, self.replica)
        if self.ok:
            duration.observe(elapsed, self.replica)
        access.ttft_s = self.ttft if self.ttft is not None else self.answered_s
        if self.usage.completion_tokens is not None:
            access.completion_tokens = self.usage.completion_tokens
        self.gw.fleet.outcome(self.replica, self.verdict, self.failure)


async def decode_head(
    gw: Gateway, a: DecodeAttempt, target: str, headers: CIMultiDict[str], body: bytes
) -> DecodeHead:
    """What decides the pair on the decode side (module docstring); raises UpstreamError."""
    resp = await gw.up.send(a.replica, "POST", target, headers, body, a.wait)
    try:
        if _is_sse(resp):
            first = await gw.up.next_chunk(resp, a.replica, a.wait)
            if not first:
                raise UpstreamUnavailable("the decode's stream ended before its first byte", retryable=True)
            return DecodeHead(resp, first, error=first_event_error(first))
        return DecodeHead(resp, None, await gw.up.read(resp, a.replica, a.wait))
    except BaseException:
        resp.close()
        raise
