"""Server-sent events as SGLang writes them: `data: <json>\n\n` per event, then `data: [DONE]\n\n`.

`stream(request, headers, cut_after, payloads)` opens a `text/event-stream` response, writes each payload
of the async iterator as one event, then `[DONE]` and the end of the body. With `framed=True` (the
/v1/responses stream: `event: <type>\ndata: <json>\n\n` frames, no `[DONE]`) each payload is a whole
frame, written as it is, and the body just ends. A cut_stream fault
(`cut_after` = K, see faults.py) closes the connection instead of writing event K + 1: the client sees
the stream end without `[DONE]`, as when a replica dies mid-answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from aiohttp import web


class StreamCut(Exception):
    """Raised by Sse.send when a cut_stream fault closes the connection."""


class Sse:
    """Writes `data: <json>` events; closes the connection after `cut_after` events (a fault)."""

    def __init__(self, request: web.Request, response: web.StreamResponse, cut_after: int | None) -> None:
        self.request = request
        self.response = response
        self.cut_after = cut_after
        self.sent = 0

    @classmethod
    async def start(cls, request: web.Request, headers: dict[str, str], cut_after: int | None) -> Sse:
        response = web.StreamResponse(headers={"Cache-Control": "no-cache", **headers})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        return cls(request, response, cut_after)

    async def send(self, payload: bytes) -> None:
        await self.send_frame(b"data: " + payload + b"\n\n")

    async def send_frame(self, frame: bytes) -> None:
        if self.cut_after is not None and self.sent >= self.cut_after:
            if self.request.transport is not None:
                self.request.transport.close()
            raise StreamCut
        await self.response.write(frame)
        self.sent += 1

    async def done(self) -> web.StreamResponse:
        await self.send(b"[DONE]")
        await self.response.write_eof()
        return self.response


async def stream(
    request: web.Request,
    headers: dict[str, str],
    cut_after: int | None,
    payloads: AsyncGenerator[bytes, None],
    framed: bool = False,
) -> web.StreamResponse:
    """Send every payload as an event, then `[DONE]` (framed: each payload a whole frame, no `[DONE]`); a
    cut fault ends the response early (and closes the generator at once, so whatever it holds is released
    before the handler returns)."""
    sse = await Sse.start(request, headers, cut_after)
    try:
        async with contextlib.aclosing(payloads):
            async for payload in payloads:
                await (sse.send_frame(payload) if framed else sse.send(payload))
        if framed:
            await sse.response.write_eof()
            return sse.response
        return await sse.done()
    except StreamCut:
        return sse.response
