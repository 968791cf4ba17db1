"""Chains outlive their replica and their gateway: a chain whose replica is stopped mid-conversation goes
on on another one; gateways sharing one Redis (``--state redis://...``) continue each other's chains and
conversations; a Redis that goes away fails only what needs it (503 ``state_unavailable``), and its keys
hold no prompt text in their names and no credential."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.conftest import Emulators, StartGateway, wait_for
from tests.proxy.conftest import EMU_FLAGS, MODEL, SYSTEM, StackFactory
from tests.proxy.responses.conftest import ASK, client
from tests.redis_server import RedisServer

LONG = str(SYSTEM["content"])


async def _turn(sdk: AsyncOpenAI, text: str, previous: str | None) -> tuple[Any, str]:
    """One turn of the chain: the response and the replica that answered it."""
    raw = await sdk.responses.with_raw_response.create(
        model=MODEL, input=text, instructions=LONG, previous_response_id=previous, max_output_tokens=12
    )
    return raw.parse(), raw.headers["x-kvroute-replica"]


async def test_a_chain_goes_on_when_its_replica_is_stopped(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=3, policy="cost", health_interval=0.1)
    async with client(stack.url) as sdk:
        first, home = await _turn(sdk, ASK, None)
        second, again = await _turn(sdk, "and then?", first.id)
        assert again == home  # the follow-up goes where its prefix is
        await stack.emulators.stop(stack.replica(home))
        third, elsewhere = await _turn(sdk, "and after that?", second.id)
        assert elsewhere != home and third.previous_response_id == second.id and third.output_text
        assert third.usage.input_tokens > second.usage.input_tokens  # the whole chain went to the new one
        fourth, last = await _turn(sdk, "thanks", third.id)
        assert last == elsewhere and fourth.usage.input_tokens_details.cached_tokens > 0


async def test_gateways_share_chains_through_redis(
    emulator_server: Emulators, gateway: StartGateway, redis_server: RedisServer
) -> None:
    urls = [(await emulator_server(*EMU_FLAGS)).url for _ in range(2)]
    a, b = [await gateway(urls, state=redis_server.url, state_namespace="t") for _ in range(2)]
    async with client(a.url) as on_a, client(b.url) as on_b:
        first, _ = await _turn(on_a, ASK, None)
        second, _ = await _turn(on_b, "and then?", first.id)
        assert (await on_a.responses.retrieve(second.id)).output_text == second.output_text
        conv = await on_b.conversations.create(items=[{"role": "user", "content": "hello"}])
        await on_a.responses.create(model=MODEL, input="hi", conversation=conv.id)
        assert len((await on_b.conversations.items.list(conv.id)).data) == 3
        await on_b.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await on_a.responses.retrieve(first.id)
    redis: Any = redis_server.client()
    ours = [k.decode() for k in redis.keys("*") if b":responses:" in k]
    assert ours and all(k.startswith("kvroute:{t}:responses:") for k in ours)
    values = b"".join(redis.get(k) or b"" for k in ours)
    assert b"Bearer" not in values and b"authorization" not in values.lower()


async def test_a_redis_outage_fails_only_what_needs_it(
    stack_factory: StackFactory, redis_server: RedisServer
) -> None:
    stack = await stack_factory(n=1, state=redis_server.url)
    async with client(stack.url) as sdk:
        kept = await sdk.responses.create(model=MODEL, input=ASK, max_output_tokens=8)
        redis_server.stop()
        answered = await sdk.responses.create(model=MODEL, input=ASK, max_output_tokens=8)  # not stored
        assert answered.output_text
        for call in (
            lambda: sdk.responses.retrieve(kept.id),
            lambda: sdk.responses.create(model=MODEL, input="x", previous_response_id=kept.id),
            lambda: sdk.conversations.create(),
        ):
            with pytest.raises(openai.InternalServerError) as down:
                await call()
            assert down.value.status_code == 503 and down.value.code == "state_unavailable"
        redis_server.start()  # back, empty

        async def stored_again() -> bool:
            made = await sdk.responses.create(model=MODEL, input=ASK, max_output_tokens=8)
            try:
                return (await sdk.responses.retrieve(made.id)).id == made.id
            except openai.APIStatusError:
                return False

        await wait_for(stored_again, timeout_s=10)
