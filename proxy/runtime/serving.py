"""Running the gateway's app: the runner, the HTTP protocol's own errors, the serve loop.

- ``GatewayRunner`` is aiohttp's ``AppRunner`` whose connections answer malformed HTTP (a control
  character in a header, Content-Length together with Transfer-Encoding, a bad request line) the way the
  rest of kvroute answers errors: an OpenAI-shaped JSON body with the status, and one WARNING line naming
  the problem, never the client's bytes. aiohttp's default is a text body and an ERROR traceback that
  echo the offending header. Unexpected 500s keep aiohttp's traceback (those are bugs) but get the JSON
  body too.
- ``serve`` listens (a port already in use is one line, not a traceback), over TLS when given an
  ``ssl.SSLContext`` (``tls_context``: ``--tls-cert/--tls-key``), prints the ready line (``kvroute ready URL
  TIMESTAMP``, the local time with its offset) once ``awaited`` says nothing is awaited any more
  (``proxy/runtime/ready_line.py``), and runs until SIGINT or SIGTERM; then drains
  (``proxy/runtime/drain.py``) and closes the app (its cleanup contexts close the upstream session and the
  health poller). It returns the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from proxy.runtime.drain import Signals, drain
from proxy.runtime.ready_line import Awaited, announce

log = logging.getLogger("kvroute.http")


class StartupError(RuntimeError):
    """The gateway cannot start (the message is one line for the operator)."""


class _GatewayRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status == 500:
            super().handle_error(request, status, exc, message)  # logs the traceback
        else:
            log.warning(
                "bad HTTP request from %s: %s (%d)", request.remote, _first_line(exc, message), status
            )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started: cannot send the error")
        kind = "invalid_request_error" if status < 500 else "internal_error"
        text = _first_line(exc, message) if status < 500 else "internal server error"
        body = {"error": {"message": text, "type": kind, "param": None, "code": status}}
        resp = web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
        resp.force_close()
        return resp


def _first_line(exc: BaseException | None, message: str | None) -> str:
    """The problem without the client's bytes: aiohttp puts the offending line after the first one."""
    text = getattr(exc, "message", None) or message or (str(exc) if exc else "bad request")
    return str(text).strip().splitlines()[0].rstrip(":") or "bad request"


class _GatewayServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _GatewayRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GatewayServer  # same state; only how connections handle protocol errors differs
        return server


def runner(app: web.Application, **kwargs: Any) -> GatewayRunner:
    """The app's runner with handler cancellation (a client that leaves cancels its handler)."""
    return GatewayRunner(app, handler_cancellation=True, access_log=None, **kwargs)


SHUTDOWN_TIMEOUT_S = 0.25  # after the drain, what still runs is cancelled (aiohttp waits this twice)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context (TLS 1.2 or later) for the PEM certificate chain and key; StartupError if
    they cannot be loaded."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise StartupError(f"cannot load the TLS certificate {cert} / key {key}: {e}") from None
    return ctx


async def serve(
    app: web.Application,
    host: str,
    port: int,
    drain_timeout_s: float = 30.0,
    ssl_context: ssl.SSLContext | None = None,
    idle_timeout: float = 75.0,
    awaited: Awaited | None = None,
    worker: bool = False,
) -> int:
    """Serves until SIGINT/SIGTERM, drains; the exit status. Raises StartupError when it cannot listen.
    A connection idle for ``idle_timeout`` seconds (no request yet, or headers that never end) is
    closed. The ready line is printed once ``awaited()`` is None (at once without it). A ``worker`` of
    ``--workers`` (``proxy/runtime/supervisor.py``) listens with ``SO_REUSEPORT`` beside its siblings
    and drains when its supervisor goes (its stdin ends)."""
    run = runner(app, shutdown_timeout=SHUTDOWN_TIMEOUT_S, keepalive_timeout=idle_timeout)
    await run.setup()
    orphaned: asyncio.Task[None] | None = None
    try:
        signals = Signals()
        try:
            await web.TCPSite(run, host, port, ssl_context=ssl_context, reuse_port=worker or None).start()
        except OSError as e:
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        scheme = "https" if ssl_context is not None else "http"
        bound = run.addresses[0][1] if port == 0 and run.addresses else port  # port 0: the one given
        ready = asyncio.ensure_future(announce(f"{scheme}://{host}:{bound}", awaited or _nothing))
        if worker:
            orphaned = asyncio.get_running_loop().create_task(_stdin_ends(signals))
        try:
            await signals.next()
        finally:
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ready
        return await drain(app, signals, drain_timeout_s)
    finally:
        if orphaned is not None:
            orphaned.cancel()
        await run.cleanup()


def _nothing() -> None:
    """Nothing awaited: the ready line is printed once the gateway listens."""


async def _stdin_ends(signals: Signals) -> None:
    """A SIGTERM of its own when stdin ends: a worker's supervisor is gone (even killed), so it drains."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while await reader.read(65536):
            pass
        log.warning("the supervisor is gone: draining")
        signals.received.put_nowait(signal.SIGTERM)
    finally:
        transport.close()
