"""The Responses tests' stack: kvroute over emulated SGLang replicas that run as SGLang 0.5.23 does by
default (no ``--enable-response-store``), and the real openai SDK pointed at the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from openai import AsyncOpenAI

from tests.proxy.conftest import EMU_FLAGS, MODEL, Stack, StackFactory

__all__ = ["MODEL", "client", "replica_bodies"]
ASK = "explain what a radix cache keeps between two chat turns"


def client(url: str, key: str = "none") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def replica_bodies(stack: Stack) -> list[dict[str, object]]:
    """The /v1/responses bodies the replicas received (oldest first per replica)."""
    logged = [e for r in stack.replicas for e in await r.requests("/v1/responses")]
    return [e["body"] for e in logged if isinstance(e.get("body"), dict)]


@pytest.fixture
async def sdk(stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with client(stack.url) as c:
        yield c


@pytest.fixture(autouse=True)
def no_store_flag() -> Iterator[None]:
    """The replicas keep no responses (SGLang's default): every chain works through the gateway only."""
    assert "--enable-response-store" not in EMU_FLAGS
    yield


@pytest.fixture
async def stack(stack_factory: StackFactory) -> Stack:
    return await stack_factory(n=2, policy="cost")
