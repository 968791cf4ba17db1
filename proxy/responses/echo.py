"""What a replica echoes, set back to what the client asked, in a whole body and in every stream event.

The replica got ``store: false``, no ``previous_response_id``, no ``conversation``, no ``background``
and the served model's name (``proxy/responses/request.py``): its response says so. ``Echo.patch`` sets,
in a response object, ``id`` (the gateway's), ``model`` (as the client sent it), ``previous_response_id``,
``store``, ``background`` and, with a conversation, ``conversation: {"id"}``; keys keep their place, so the
JSON is the replica's but for those values.

A stream keeps SGLang's framing (``event: <type>`` then ``data: <json>``, a blank line, no ``[DONE]``).
``EchoTap`` (the ``proxy.dispatch.forward`` Tap of a create) splits the relayed bytes into events and
rewrites those whose data holds a ``response`` object (``response.created``, ``.in_progress``,
``.queued`` and the terminal ones); every other event passes byte for byte, in the chunks they came in
(an event split across chunks waits for its end). Before the terminal event (``response.completed``,
``.incomplete``, ``.failed``) is written, the final response is handed to ``on_final`` and awaited: it is
stored before the client can ask for the next turn.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson

from proxy.types import JSONObject

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_EVENT_END = re.compile(rb"\r?\n\r?\n")
Final = Callable[[JSONObject], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Echo:
    id: str
    model: str  # as the client sent it
    previous_response_id: str | None
    store: bool
    background: bool
    conversation: str | None

    def patch(self, response: JSONObject) -> JSONObject:
        """``response`` with the client's values (in place); returns it."""
        response["id"] = self.id
        if "model" in response:
            response["model"] = self.model
        response["previous_response_id"] = self.previous_response_id
        response["store"] = self.store
        if self.background or "background" in response:
            response["background"] = self.background
        if self.conversation is not None:
            response["conversation"] = {"id": self.conversation}
        return response

    def body(self, raw: bytes) -> JSONObject | None:
        """A whole response body, patched; None when it is not a response object."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or doc.get("object") != "response":
            return None
        return self.patch(doc)

    def event(self, event: bytes) -> tuple[bytes, JSONObject | None]:
        """One SSE event (without its blank line): rewritten when it carries a response, and that
        response when the event is terminal."""
        if b'"response"' not in event:
            return event, None
        lines = event.split(b"\n")
        at = next((i for i, line in enumerate(lines) if line.startswith(b"data:")), None)
        doc = _loads(lines[at][5:]) if at is not None else None
        response = doc.get("response") if isinstance(doc, dict) else None
        if at is None or not isinstance(doc, dict) or not isinstance(response, dict):
            return event, None
        self.patch(response)
        end = b"\r" if lines[at].endswith(b"\r") else b""
        lines[at] = b"data: " + orjson.dumps(doc) + end
        return b"\n".join(lines), response if doc.get("type") in TERMINAL else None


def _loads(data: bytes) -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def split_events(buffer: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Complete events (each with its blank-line separator) and the incomplete rest."""
    events: list[tuple[bytes, bytes]] = []
    start = 0
    for m in _EVENT_END.finditer(buffer):
        events.append((buffer[start : m.start()], m.group()))
        start = m.end()
    return events, buffer[start:]


class EchoTap:
    """The Tap of one create: patches a stream's events; ``final`` is the last response it saw end."""

    def __init__(self, echo: Echo, on_final: Final) -> None:
        self.echo, self.on_final = echo, on_final
        self.final: JSONObject | None = None

    def body(self, status: int, body: bytes) -> None:
        """Whole bodies are patched once ``forward`` returned (``proxy/responses/create.py``)."""

    async def stream(self, status: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        rest = b""
        async for chunk in chunks:
            if status != 200:
                yield chunk
                continue
            events, rest = split_events(rest + chunk)
            out: list[bytes] = []
            for event, sep in events:
                rewritten, final = self.echo.event(event)
                if final is not None:
                    if out:
                        yield b"".join(out)
                        out = []
                    self.final = final
                    await self.on_final(final)
                out.append(rewritten + sep)
            if out:
                yield b"".join(out)
        if rest:
            yield rest
