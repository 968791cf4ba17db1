"""Shared fixtures: real servers on 127.0.0.1 (port 0), the real emulator instead of hand-written fakes.

- ``emulator_server``: ``await emulator_server("--flag", ...)`` starts one emulated SGLang replica in this
  event loop (``emulator.server.build_app`` on an aiohttp TCPSite, on 127.0.0.1 or the loopback address
  given as ``host``) and returns an ``Emu``; ``Emu`` drives
  the replica's own HTTP endpoints: ``fault(...)`` (POST /_emu/faults, needs --emu-enable-faults),
  ``state()`` (GET /_emu/state) and ``requests()`` (GET /_emu/requests, both need --emu-debug).
  ``emulator_server.stop(emu)`` stops one replica; starting again with ``port=emu.port`` brings a new
  process-like replica up at the same address (a restart, possibly with other flags).
- ``gateway``: ``await gateway(backends, **settings)`` starts kvroute (``proxy.server.build_app``).
- ``serve(app)``: the context manager both use; ``wait_for(cond)`` polls a sync or async condition.
Everything started is stopped at teardown (runners, then the one HTTP session).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from emulator.config import parse_args
from emulator.replica import REPLICA, Replica
from emulator.server import build_app as build_emulator
from emulator.server import make_runner
from proxy.config.settings import Settings
from proxy.context import GATEWAY, Gateway
from proxy.runtime.serving import GatewayRunner
from proxy.server import build_app as build_gateway

MODEL = "emu-model"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@asynccontextmanager
async def serve(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    """Serves a gateway ``app`` on 127.0.0.1 (a free port unless given) with the production runner."""
    runner = GatewayRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def wait_for(cond: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Polls ``cond`` every 20 ms; fails the test if it is still false after ``timeout_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = cond()
        if await result if inspect.isawaitable(result) else result:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@dataclass(frozen=True, slots=True)
class Emu:
    """One in-process emulated replica and the HTTP session that talks to it."""

    url: str
    app: web.Application
    http: aiohttp.ClientSession

    @property
    def replica(self) -> Replica:
        return self.app[REPLICA]

    @property
    def port(self) -> int:
        return self.replica.port

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        async with self.http.request(method, self.url + path, json=body) as resp:
            assert resp.status == 200, (path, resp.status, await resp.text())
            return await resp.json()

    async def fault(self, **body: object) -> dict[str, Any]:
        """Arms one fault (see emulator/faults.py); returns the armed faults."""
        result: dict[str, Any] = await self._json("POST", "/_emu/faults", body)
        return result

    async def state(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", "/_emu/state")
        return result

    async def requests(self, *paths: str) -> list[dict[str, Any]]:
        """The logged requests (oldest first), only those to ``paths`` when given."""
        doc = await self._json("GET", "/_emu/requests")
        return [e for e in doc["requests"] if not paths or e["path"] in paths]

    async def generations(self) -> list[dict[str, Any]]:
        """The logged generation requests (chat, completions, /generate)."""
        return await self.requests(*GENERATION_PATHS)

    async def served(self) -> int:
        """Requests the engine admitted (a request failed by a fault or reset before is not counted)."""
        return int((await self.state())["requests_total"])


class Emulators:
    """The ``emulator_server`` fixture: starts replicas; all stop at teardown."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self._runners: dict[str, web.AppRunner] = {}

    async def __call__(self, *flags: str, port: int = 0, host: str = "127.0.0.1") -> Emu:
        app = build_emulator(parse_args([*flags, "--port", str(port)]))
        runner = make_runner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        bound = runner.addresses[0][1]
        app[REPLICA].port = bound
        url = f"http://{host}:{bound}"
        self._runners[url] = runner
        return Emu(url, app, self.http)

    async def stop(self, emu: Emu) -> None:
        """Stops one replica now (its connections close, its port is free again)."""
        runner = self._runners.pop(emu.url, None)
        if runner is not None:
            await runner.cleanup()

    async def close(self) -> None:
        runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            await runner.cleanup()


StartEmu = Emulators


@pytest.fixture
async def emulator_server() -> AsyncIterator[Emulators]:
    async with aiohttp.ClientSession() as http:
        emulators = Emulators(http)
        try:
            yield emulators
        finally:
            await emulators.close()


@dataclass(frozen=True, slots=True)
class Gw:
    """A running kvroute gateway."""

    url: str
    app: web.Application

    @property
    def gw(self) -> Gateway:
        return self.app[GATEWAY]

    def metrics(self) -> str:
        return self.gw.metrics.render().decode()


StartGateway = Callable[..., Awaitable[Gw]]


@pytest.fixture
async def gateway() -> AsyncIterator[StartGateway]:
    """``await gateway(backends, **settings)``: kvroute over ``backends``; all stop at teardown."""
    async with AsyncExitStack() as exits:

        async def start(backends: list[str] | tuple[str, ...], **settings: Any) -> Gw:
            app = build_gateway(Settings(backends=tuple(backends), **settings))
            url = await exits.enter_async_context(serve(app))
            return Gw(url, app)

        yield start
