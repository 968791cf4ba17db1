"""What reaches a replica, recorded: a relay between the gateway and one emulated replica, and a raw HTTP
client that sends a request target exactly as written (``curl --path-as-is``).

``Recorder`` is an aiohttp app in front of a real emulator: every request it receives is kept (method,
the raw request target, headers, body) and relayed to the emulator with the target untouched; the
emulator's answer comes back as it was. A security test asserts on ``Recorder.seen``, what arrived,
not only on the status the gateway answered.

``raw_request`` writes one HTTP/1.1 request on a fresh connection: no client library normalizes its
path, collapses dot segments or re-encodes bytes on the way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web
from yarl import URL

# the gateway's own polling of a replica: not what a client sent
POLLED = ("/health", "/ready", "/get_server_info", "/server_info", "/get_model_info", "/model_info")
POLLED += ("/metrics", "/v1/models", "/get_load", "/v1/loads")

# SGLang's replica control endpoints (sglang-contract §1.1): no client may reach them through the gateway
CONTROL_PATHS = (
    "/flush_cache",
    "/abort_request",
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/update_weights_from_distributed",
    "/init_weights_update_group",
    "/start_profile",
    "/stop_profile",
    "/load_lora_adapter",
    "/unload_lora_adapter",
    "/pause_generation",
    "/continue_generation",
    "/set_internal_state",
    "/open_session",
    "/close_session",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/hicache/storage-backend",
    "/clear_hicache_storage_backend",
)


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    target: str  # the raw request target as it arrived
    headers: Mapping[str, str]
    body: bytes

    @property
    def path(self) -> str:
        """The path as a server that resolves dot segments and percent-escapes would read it."""
        raw = unquote(self.target.split("?", 1)[0])
        out: list[str] = []
        for seg in raw.split("/"):
            if seg == "..":
                if out:
                    out.pop()
            elif seg not in (".", ""):
                out.append(seg)
        return "/" + "/".join(out)


class Recorder:
    """Relays to ``target`` and keeps every request it received (``seen``)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.seen: list[Seen] = []
        self.set_cookie: str | None = None  # a Set-Cookie every answer carries, when set
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._relay)
        self._session: aiohttp.ClientSession | None = None

    def client_requests(self) -> list[Seen]:
        """What arrived that the gateway's own polling did not send."""
        return [s for s in self.seen if s.path not in POLLED]

    def control_hits(self) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith(CONTROL_PATHS)]

    async def _relay(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append(Seen(request.method, request.raw_path, dict(request.headers), body))
        assert self._session is not None
        url = URL(self.target + request.raw_path, encoded=True)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(request.method, url, headers=headers, data=body) as r:
            payload = await r.read()
            kept = {k: v for k, v in r.headers.items() if k.lower() in ("content-type", "x-emu-replica")}
            if self.set_cookie is not None:
                kept["Set-Cookie"] = self.set_cookie
            return web.Response(status=r.status, body=payload, headers=kept)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        """Serves the recorder on a free loopback port; yields its base URL."""
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            async with serve_loopback(self.app) as url:
                yield url
        finally:
            await self._session.close()


@asynccontextmanager
async def serve_loopback(app: web.Application, **runner: Any) -> AsyncIterator[str]:
    """``app`` on a free loopback port (``runner``: more ``web.AppRunner`` options); yields its base URL."""
    served = web.AppRunner(app, access_log=None, **runner)
    await served.setup()
    try:
        site = web.TCPSite(served, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{served.addresses[0][1]}"
    finally:
        await served.cleanup()


async def raw_request(
    base: str,
    method: str,
    target: str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    raw_headers: bytes = b"",
) -> tuple[int, bytes]:
    """(status, body) of one request whose target is sent byte for byte; ``raw_headers`` are extra
    header lines as bytes (e.g. a value that is not UTF-8)."""
    parts = urlsplit(base)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append(f"Content-Length: {len(body)}")
    writer.write("\r\n".join(lines).encode() + b"\r\n" + raw_headers + b"\r\n" + body)
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = _dechunk(payload)
    return status, payload


def _dechunk(data: bytes) -> bytes:
    out, rest = b"", data
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out
