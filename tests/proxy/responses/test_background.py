"""Background responses run by the gateway, and cancel: a ``queued`` answer at once, GET polls it to its
end; an in-flight response (background or streamed) cancelled is ``cancelled`` and aborted on the
replica (SGLang's ``/abort_request`` with the id); a finished one is returned as it is; a background turn
counts as a request in progress until it ends (``max_inflight``)."""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI

from proxy.responses.state import RESPONSES
from tests.proxy.conftest import MODEL, Stack, StackFactory, wait_for
from tests.proxy.responses.conftest import ASK, client

SLOW = 400.0  # every modelled duration x this: a long answer takes seconds


async def _status(sdk: AsyncOpenAI, response_id: str) -> str:
    return str((await sdk.responses.retrieve(response_id)).status)


async def _is(sdk: AsyncOpenAI, response_id: str, status: str) -> bool:
    return await _status(sdk, response_id) == status


async def _aborted(stack: Stack, rid: str) -> bool:
    states = [await r.state() for r in stack.replicas]
    return any(rid in s["abort_requests"]["rids"] for s in states)


async def _slow(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="slow", factor=SLOW)


async def test_a_background_response_is_polled_to_its_end(sdk: AsyncOpenAI) -> None:
    queued = await sdk.responses.create(model=MODEL, input=ASK, background=True, max_output_tokens=16)
    assert queued.status == "queued" and queued.background is True and queued.output == []

    async def done() -> bool:
        return await _status(sdk, queued.id) not in ("queued", "in_progress")

    await wait_for(done, timeout_s=20)
    final = await sdk.responses.retrieve(queued.id)
    assert final.status == "incomplete" and final.output_text and final.background is True
    assert final.usage is not None and final.usage.output_tokens == 14  # SGLang's max_output_tokens - 2
    follow = await sdk.responses.create(model=MODEL, input="go on", previous_response_id=queued.id)
    assert follow.previous_response_id == queued.id and follow.output_text
    unchanged = await sdk.responses.cancel(queued.id)  # finished: returned as it is
    assert unchanged.status == "incomplete"


async def test_cancel_a_background_response_in_flight(sdk: AsyncOpenAI, stack: Stack) -> None:
    await _slow(stack)
    queued = await sdk.responses.create(model=MODEL, input=ASK, background=True, max_output_tokens=4000)
    await wait_for(lambda: _is(sdk, queued.id, "in_progress"), timeout_s=10)
    cancelled = await sdk.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    await wait_for(lambda: _aborted(stack, queued.id), timeout_s=10)
    assert await _status(sdk, queued.id) == "cancelled"
    assert queued.id not in stack.app[RESPONSES].tasks  # the gateway's task is over


async def test_cancel_a_stream_in_flight(sdk: AsyncOpenAI, stack: Stack) -> None:
    await _slow(stack)
    stream = await sdk.responses.create(model=MODEL, input=ASK, stream=True, max_output_tokens=4000)
    kinds: list[str] = []
    rid = ""
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.created":
            rid = event.response.id
            assert await _status(sdk, rid) == "in_progress"  # stored from its start
        if event.type == "response.output_text.delta" and kinds.count(event.type) == 1:
            assert (await sdk.responses.cancel(rid)).status == "cancelled"
    assert kinds[-1] == "response.failed"  # the replica aborted it and ended its stream
    assert await _aborted(stack, rid)
    assert await _status(sdk, rid) == "cancelled"


async def test_background_turns_count_as_requests_in_progress(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, max_inflight=2)
    await _slow(stack)
    async with client(stack.url) as sdk:
        running = await sdk.responses.create(model=MODEL, input=ASK, background=True, max_output_tokens=4000)
        with pytest.raises(openai.RateLimitError):  # its task and this request: the gateway is full
            await sdk.responses.create(model=MODEL, input=ASK, background=True)
        await sdk.responses.cancel(running.id)
        await wait_for(lambda: stack.gw.admission.inflight == 0, timeout_s=10)
        assert (await sdk.responses.create(model=MODEL, input=ASK, background=True)).status == "queued"
