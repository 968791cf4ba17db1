"""The gateway's unit-test stack: kvroute (round robin, fast health checks) in front of in-process
emulated SGLang replicas with faults and the debug views on (see tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from tests.conftest import MODEL, Emu, Emulators, StartGateway, serve, wait_for
from tests.redis_server import RedisServer

__all__ = [
    "ADMIN",
    "EMU_FLAGS",
    "MODEL",
    "PLAIN_FLAGS",
    "SYSTEM",
    "Stack",
    "StackFactory",
    "post",
    "serve",
    "spy_threads",
    "wait_for",
]


def spy_threads(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[object]:
    """The functions ``module`` runs through ``asyncio.to_thread`` from now on (they still run)."""
    calls: list[object] = []
    real = module.asyncio.to_thread

    async def spy(fn: Any, *args: Any) -> Any:
        calls.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(module.asyncio, "to_thread", spy)
    return calls


ADMIN_KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}  # the admin API and /flush_cache

# page 16, 100K GPU tokens, HiCache write_back with ratio 2 → a 200_016-token host pool
EMU_FLAGS = (
    "--served-model-name",
    MODEL,
    "--emu-time-scale",
    "0.01",
    "--emu-enable-faults",
    "--emu-debug",
    "--enable-metrics",
    "--enable-cache-report",
    "--tool-call-parser",
    "qwen25",
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "write_back",
    "--page-size",
    "16",
    "--max-total-tokens",
    "100000",
)
# a replica as SGLang starts by default: no HiCache, no --enable-metrics (the status views warn about both)
_HICACHE = EMU_FLAGS.index("--enable-hierarchical-cache")
PLAIN_FLAGS = tuple(f for f in EMU_FLAGS[:_HICACHE] + EMU_FLAGS[_HICACHE + 3 :] if f != "--enable-metrics")
# long enough to fill cache pages: a repeated request gets cached_tokens > 0
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}


@dataclasses.dataclass
class Stack:
    url: str
    app: web.Application
    replicas: list[Emu]
    urls: list[str]
    emulators: Emulators

    @property
    def gw(self) -> Gateway:
        return self.app[GATEWAY]

    def metrics(self) -> str:
        return self.gw.metrics.render().decode()

    def replica(self, url: str) -> Emu:
        return self.replicas[self.urls.index(url)]

    async def generations(self) -> list[dict[str, Any]]:
        """Generation requests logged by all replicas."""
        return [e for r in self.replicas for e in await r.generations()]

    async def flush(self) -> None:
        """Empties every replica's cache directly (not through the gateway)."""
        for r in self.replicas:
            async with r.http.post(r.url + "/flush_cache") as resp:
                assert resp.status == 200


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def stack_factory(emulator_server: Emulators, gateway: StartGateway) -> AsyncIterator[StackFactory]:
    async def make(
        n: int = 2, models: Sequence[str] | None = None, emu_flags: Sequence[str] = (), **settings: Any
    ) -> Stack:
        names = list(models) if models is not None else [MODEL] * n
        replicas = [await emulator_server(*EMU_FLAGS, "--served-model-name", m, *emu_flags) for m in names]
        urls = [r.url for r in replicas]
        defaults = {"health_interval": 0.1, "policy": "round_robin", "retries": 2, "admin_key": ADMIN_KEY}
        gw = await gateway(urls, **(defaults | settings))
        return Stack(gw.url, gw.app, replicas, urls, emulator_server)

    yield make


@pytest.fixture
async def stack(stack_factory: StackFactory) -> Stack:
    return await stack_factory()


async def post(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body bytes, lower-cased headers) of one POST."""
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body, headers=headers or {}) as r:
        return r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()}


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` of the test's own on a free port (stopped at teardown)."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (Debian package redis-server)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
