"""A streaming relay in front of one emulated PD server that records what it received and what it sent.

``Tap`` relays every request to its target as it arrives and the answer back chunk by chunk, keeping the
request bodies (``bodies``), the raw bytes of each answer as the target sent them (``answers``) and an
event log shared by the taps of one test (``events``: "in:NAME", "head:NAME", "end:NAME", "gone:NAME" when
the gateway closed the connection before the answer ended). Generation requests only; the gateway's own
polling (health, info, metrics) is relayed and not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from tests.proxy.recorder import POLLED, serve_loopback

KEPT = ("content-type", "x-emu-replica")


class Tap:
    def __init__(self, name: str, target: str, events: list[str]) -> None:
        self.name, self.target, self.events = name, target, events
        self.bodies: list[bytes] = []
        self.answers: list[bytes] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session: aiohttp.ClientSession | None = None

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        polled = request.path in POLLED
        if not polled:
            self.bodies.append(body)
            self.events.append(f"in:{self.name}")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        sent = bytearray()
        try:
            async with self._session.request(
                request.method, self.target + request.rel_url.raw_path_qs, headers=headers, data=body
            ) as r:
                out = web.StreamResponse(
                    status=r.status, headers={k: v for k, v in r.headers.items() if k.lower() in KEPT}
                )
                await out.prepare(request)
                if not polled:
                    self.events.append(f"head:{self.name}")
                async for chunk in r.content.iter_any():
                    sent += chunk
                    await out.write(chunk)
                await out.write_eof()
                if not polled:
                    self.events.append(f"end:{self.name}")
                return out
        except (asyncio.CancelledError, ConnectionResetError):
            if not polled:
                self.events.append(f"gone:{self.name}")
            raise
        finally:
            if not polled:
                self.answers.append(bytes(sent))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            async with serve_loopback(self.app, handler_cancellation=True, shutdown_timeout=0.5) as url:
                yield url
        finally:
            await self._session.close()
