"""Byte-faithful relaying of one upstream response, and reading ``usage`` on the way.

Headers: hop-by-hop ones (and those a ``Connection`` header names) are never relayed either way, nor a
client's ``Authorization`` (its key is kvroute's; ``proxy/upstream/client.py`` adds the gateway's own
credential for the replica), ``Host``, ``Forwarded``, ``X-Forwarded-*``, ``X-Real-IP`` or
``x-kvroute-*``, nor a replica's ``x-kvroute-*`` (kvroute adds its own). Non-streamed answers are
read whole and sent with the replica's status, content type and body bytes. Streamed answers
(``text/event-stream``) are written chunk by chunk as they arrive: no buffering, no re-encoding, one
``write`` per received chunk (TCP_NODELAY is on, so each goes out at once).

``SSESniffer`` watches the stream without changing it: it splits events on blank lines, keeps the
first event's ``id`` (SGLang's rid, needed to abort) and the last event that carries token counts
(the usage chunk of OpenAI routes, ``meta_info`` on ``/generate``, the terminal event's ``response.usage``
on ``/v1/responses``), and parses that one event at the end. Ordinary chunks cost one substring search.
A stream is complete at ``data: [DONE]``, or on ``/v1/responses`` (``event: <type>`` before each
``data:``, no ``[DONE]``) at its terminal event: ``response.completed``, ``.incomplete`` or ``.failed``.
``first_event_error`` reads the code of an in-band error that a stream begins with (SGLang's way to fail
a request it had accepted: the gateway retries it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.types import Usage

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
        "host",
        "proxy-connection",
    }
)
_DROP_REQUEST = HOP_BY_HOP | {"forwarded", "x-real-ip", "authorization"}
_DROP_RESPONSE = HOP_BY_HOP | {"date", "server"}
_OWN_PREFIXES = ("x-kvroute-", "x-forwarded-")  # kvroute's own headers; the upstream address's


def _kept(headers: Mapping[str, str], drop: frozenset[str]) -> CIMultiDict[str]:
    """The headers but the dropped ones, those a ``Connection`` header names (hop-by-hop too, RFC 9110
    §7.6.1) and kvroute's own ``x-kvroute-*`` and ``x-forwarded-*`` (nobody else may set them)."""
    named = {t.strip().lower() for k, v in headers.items() if k.lower() == "connection" for t in v.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        low = k.lower()
        if low not in drop and low not in named and not low.startswith(_OWN_PREFIXES):
            out.add(k, v)
    return out


def forward_headers(headers: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    out = _kept(headers, _DROP_REQUEST)
    for k, v in extra.items():
        out[k] = v
    return out


def response_headers(headers: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    out = _kept(headers, _DROP_RESPONSE)
    for k, v in extra.items():
        out[k] = v
    return out


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


RESPONSES_END = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})


def _responses_usage(u: dict[str, Any]) -> Usage:
    details = u.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(_int(u.get("input_tokens")), _int(u.get("output_tokens")), cached)


def usage_of(doc: object) -> Usage:
    """Usage from an OpenAI response/chunk (``usage``), a Responses object or stream event (its
    ``input_tokens``; an event's under ``response``) or a native one (``meta_info``)."""
    if isinstance(doc, dict) and isinstance(doc.get("response"), dict):
        doc = doc["response"]
    if not isinstance(doc, dict):
        return Usage()
    u = doc.get("usage")
    if isinstance(u, dict) and "input_tokens" in u:
        return _responses_usage(u)
    if isinstance(u, dict):
        details = u.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        return Usage(_int(u.get("prompt_tokens")), _int(u.get("completion_tokens")), cached)
    m = doc.get("meta_info")
    if isinstance(m, dict):
        return Usage(
            _int(m.get("prompt_tokens")), _int(m.get("completion_tokens")), _int(m.get("cached_tokens"))
        )
    return Usage()


def rid_of(doc: object) -> str | None:
    if not isinstance(doc, dict):
        return None
    rid = doc.get("id")
    if rid is None and isinstance(doc.get("meta_info"), dict):
        rid = doc["meta_info"].get("id")
    if rid is None and isinstance(doc.get("response"), dict):  # a /v1/responses event
        rid = doc["response"].get("id")
    return rid if isinstance(rid, str) else None


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class SSESniffer:
    def __init__(self) -> None:
        self._tail = b""
        self._usage_event: bytes | None = None
        self.rid: str | None = None
        self.saw_done = False

    def feed(self, chunk: bytes) -> None:
        if b"\n\n" not in chunk and b"\r\n\r\n" not in chunk:
            self._tail += chunk
            return
        events = (self._tail + chunk).replace(b"\r\n", b"\n").split(b"\n\n")
        self._tail = events.pop()
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        if event.startswith(b"event:"):  # a named event (/v1/responses): its data line follows
            name, _, event = event.partition(b"\n")
            self.saw_done = self.saw_done or name[6:].strip() in RESPONSES_END
        if not event.startswith(b"data:"):
            return
        data = event[5:].strip()
        if data == b"[DONE]":
            self.saw_done = True
        elif self.rid is None:
            self.rid = rid_of(_loads(data))
        if b'"prompt_tokens"' in data or b'"input_tokens"' in data:
            self._usage_event = data

    def usage(self) -> Usage:
        return usage_of(_loads(self._usage_event)) if self._usage_event is not None else Usage()


def first_event_error(chunk: bytes) -> int | None:
    """The code of an in-band error that a stream's first chunk begins with (``data: {"error": ...}``,
    500 when it names none); None when it begins with anything else or the event is incomplete."""
    if not chunk.startswith(b'data: {"error"'):
        return None
    event, sep, _ = chunk.replace(b"\r\n", b"\n").partition(b"\n\n")
    doc = _loads(event[5:].strip()) if sep else None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) else 500


def body_usage(body: bytes) -> Usage:
    counted = b'"prompt_tokens"' in body or b'"input_tokens"' in body
    return usage_of(_loads(body)) if counted else Usage()


class ClientStalled(Exception):
    """The client stopped reading: a write waited longer than the write timeout."""


async def relay_stream(
    out: web.StreamResponse,
    chunks: AsyncIterator[bytes],
    sniffer: SSESniffer,
    on_first: Callable[[], None],
    write_timeout_s: float,
) -> None:
    """Writes every upstream chunk to the prepared client response as it arrives; raises
    ``ClientStalled`` when one write waits more than ``write_timeout_s`` (the client's socket is full)."""
    first = True
    async for chunk in chunks:
        if first:
            on_first()
            first = False
        sniffer.feed(chunk)
        try:
            async with asyncio.timeout(write_timeout_s):
                await out.write(chunk)
        except TimeoutError:
            raise ClientStalled(f"the client read nothing for {write_timeout_s:g} s") from None


async def end_body(out: web.StreamResponse) -> None:
    """The end of a relayed body. A client may leave as soon as it has read the last event (an SSE
    client on ``[DONE]``), before the chunked terminator: its answer was delivered whole, so a closing
    transport here is no error (aiohttp's own end of a response treats it so too). Otherwise aiohttp
    logged "Error handling request" with a traceback, 4-14 times per bench run of 200 requests."""
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
