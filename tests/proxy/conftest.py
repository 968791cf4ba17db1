"""Fixtures: real servers on port 0 (fake replicas, the gateway), the real openai SDK."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from proxy.server import build_app
from proxy.settings import Settings
from tests.proxy.fake_replica import FakeReplica


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclasses.dataclass
class Stack:
    url: str
    app: web.Application
    replicas: list[FakeReplica]
    urls: list[str]


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def stack_factory() -> AsyncIterator[StackFactory]:
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as exits:

        async def make(n: int = 2, **settings_kw: object) -> Stack:
            replicas = [FakeReplica() for _ in range(n)]
            urls = [await exits.enter_async_context(serve(r.app())) for r in replicas]
            base = {"backends": tuple(urls), "health_interval": 0.1, "policy": "round_robin", "retries": 2}
            base.update(settings_kw)
            settings = Settings(**base)  # type: ignore[arg-type]
            settings = dataclasses.replace(
                settings,
                routing=dataclasses.replace(settings.routing, policy=settings.policy),  # type: ignore[arg-type]
            )
            app = build_app(settings)
            url = await exits.enter_async_context(serve(app))
            return Stack(url, app, replicas, urls)

        yield make


@pytest.fixture
async def stack(stack_factory: StackFactory) -> Stack:
    return await stack_factory()


async def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Polls ``cond`` every 20 ms; fails the test if it is still false after ``timeout_s`` seconds."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
