"""Fixtures: in-process emulated replicas on port 0 (build_app + a real TCPSite) and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from emulator.config import parse_args
from emulator.replica import REPLICA, Replica
from emulator.server import build_app, make_runner


@dataclass(frozen=True, slots=True)
class Emu:
    url: str
    app: web.Application

    @property
    def replica(self) -> Replica:
        return self.app[REPLICA]


StartEmu = Callable[..., Awaitable[Emu]]


@pytest.fixture
async def emulator() -> AsyncIterator[StartEmu]:
    """`await emulator("--flag", ...)` starts one replica in this event loop; all stop at teardown."""
    runners: list[web.AppRunner] = []

    async def start(*args: str) -> Emu:
        app = build_app(parse_args([*args, "--port", "0"]))
        runner = make_runner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        app[REPLICA].port = port
        return Emu(f"http://127.0.0.1:{port}", app)

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
