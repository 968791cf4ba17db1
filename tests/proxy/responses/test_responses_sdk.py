"""The real openai SDK against kvroute's /v1/responses over stock replicas (no response store): chains by
``previous_response_id``, streams, retrieve, delete, input items, ``store: false``, the replica's own 400s,
and what a replica receives (the chain expanded, ``store: false``, the gateway's id as ``request_id``)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from tests.conftest import Emulators, StartGateway
from tests.proxy.conftest import EMU_FLAGS, MODEL, SYSTEM, Stack, post
from tests.proxy.recorder import Recorder
from tests.proxy.responses.conftest import ASK, client

TOOL: Any = {
    "type": "function",
    "name": "lookup",
    "description": "look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    "strict": True,
}


LONG = str(SYSTEM["content"])  # instructions long enough to fill cache pages: the chain stays on its replica


async def test_a_chain_on_replicas_without_a_store(sdk: AsyncOpenAI, stack: Stack) -> None:
    first = await sdk.responses.create(model=MODEL, input=ASK, instructions=LONG, max_output_tokens=24)
    assert (
        first.id.startswith("resp_")
        and first.to_dict()["store"] is True
        and first.previous_response_id is None
    )
    assert first.output_text and first.usage is not None
    second = await sdk.responses.create(
        model=MODEL, input="and after that?", previous_response_id=first.id, instructions=LONG
    )
    assert second.previous_response_id == first.id and second.to_dict()["store"] is True
    assert second.usage is not None and first.usage is not None
    # the whole first turn (its prompt and its answer) is the cached prefix of the second
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.total_tokens - 16
    third = await sdk.responses.create(model=MODEL, input="thanks", previous_response_id=second.id)
    assert third.previous_response_id == second.id and third.output_text
    assert (await sdk.responses.retrieve(second.id)).model_dump() == second.model_dump()


async def test_streams_are_patched_in_every_lifecycle_event(sdk: AsyncOpenAI) -> None:
    first = await sdk.responses.create(model=MODEL, input=ASK, max_output_tokens=16)
    async with sdk.responses.stream(model=MODEL, input="go on", previous_response_id=first.id) as helper:
        events = [e async for e in helper]
        final = await helper.get_final_response()
    lifecycle = [e.response for e in events if hasattr(e, "response")]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert len(lifecycle) == 3 and {r.id for r in lifecycle} == {final.id}
    assert all(r.previous_response_id == first.id and r.to_dict()["store"] is True for r in lifecycle)
    assert (await sdk.responses.retrieve(final.id)).output_text == final.output_text
    again = await sdk.responses.create(model=MODEL, input="more", previous_response_id=final.id, stream=True)
    kinds = [e.type async for e in again]
    assert kinds[-1] in ("response.completed", "response.incomplete")


async def test_delete_input_items_and_unknown_ids(sdk: AsyncOpenAI) -> None:
    first = await sdk.responses.create(
        model=MODEL, input=[{"role": "user", "content": ASK}], max_output_tokens=8
    )
    items = await sdk.responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].id.startswith("msg_")
    assert (await sdk.responses.input_items.list(first.id)).data[0].id == items.data[0].id  # stable
    follow = await sdk.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    await sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        await sdk.responses.retrieve(first.id)
    assert gone.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as broken:
        await sdk.responses.create(model=MODEL, input="and now?", previous_response_id=follow.id)
    assert first.id in broken.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.responses.create(model=MODEL, input="hi", previous_response_id="resp_" + "0" * 32)
    assert unknown.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete(first.id)
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.retrieve("chatcmpl-1")


async def test_store_false_and_field_checks(sdk: AsyncOpenAI) -> None:
    kept_not = await sdk.responses.create(model=MODEL, input=ASK, store=False, max_output_tokens=8)
    assert kept_not.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(kept_not.id)
    with pytest.raises(openai.BadRequestError) as both:
        await sdk.responses.create(
            model=MODEL, input="x", previous_response_id="resp_1", conversation="conv_1"
        )
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as background:
        await sdk.responses.create(model=MODEL, input="x", background=True, store=False)
    assert background.value.message.endswith("background=true requires store=true.")
    # the replica's own 400 (an include value SGLang does not know) passes as it is, nothing stored
    with pytest.raises(openai.BadRequestError) as upstream:
        await sdk.responses.create(model=MODEL, input="x", include=["nonsense"])  # type: ignore[list-item]
    assert upstream.value.body["code"] == 400  # type: ignore[index]  # SGLang's numeric code


async def test_tool_calls_round_trip_through_a_chain(sdk: AsyncOpenAI) -> None:
    called = await sdk.responses.create(model=MODEL, input=ASK, tools=[TOOL], instructions=LONG)
    (call,) = called.output
    assert isinstance(call, ResponseFunctionToolCall) and isinstance(json.loads(call.arguments), dict)
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "a tree of prefixes"}
    answer = await sdk.responses.create(
        model=MODEL, input=[result], tools=[TOOL], previous_response_id=called.id, instructions=LONG
    )
    assert isinstance(answer.output[0], ResponseOutputMessage) and answer.output_text
    assert answer.usage is not None and answer.usage.input_tokens_details.cached_tokens > 0


async def test_what_the_replica_receives(emulator_server: Emulators, gateway: StartGateway) -> None:
    emu = await emulator_server(*EMU_FLAGS)
    recorder = Recorder(emu.url)
    async with recorder.running() as url:
        gw = await gateway([url], health_interval=0.1)
        async with client(gw.url) as sdk:
            first = await sdk.responses.create(
                model="gpt-4o", input=ASK, instructions="Be brief.", max_output_tokens=8
            )
            assert first.model == "gpt-4o"  # as the client sent it; the replica was sent its served name
            second = await sdk.responses.create(
                model="gpt-4o", input="go on", previous_response_id=first.id, metadata={"k": "v"}
            )
    sent = [orjson.loads(s.body) for s in recorder.client_requests() if s.path == "/v1/responses"]
    assert [b["request_id"] for b in sent] == [first.id, second.id]
    assert all(b["store"] is False and b["model"] == MODEL for b in sent)
    assert all("previous_response_id" not in b and "background" not in b for b in sent)
    assert sent[1]["input"][0] == {"role": "user", "content": ASK}
    assert sent[1]["input"][1]["type"] == "message" and sent[1]["input"][1]["role"] == "assistant"
    assert sent[1]["input"][-1] == {"role": "user", "content": "go on"} and "instructions" not in sent[1]
    assert second.metadata == {"k": "v"} and second.previous_response_id == first.id


async def test_http_details(stack: Stack) -> None:
    """A body that is not JSON-typed is a 400 as on SGLang; a method a route does not take, a 405."""
    body = orjson.dumps({"model": MODEL, "input": "hi"})
    status, answer, _ = await post(stack.url, "/v1/responses", body, {"Content-Type": "text/plain"})
    assert status == 400 and orjson.loads(answer)["error"]["code"] == "unsupported_content_type"
    async with aiohttp.ClientSession() as s:
        async with s.put(stack.url + "/v1/responses/resp_1", data=body) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, DELETE"
        async with s.get(stack.url + "/v1/responses") as r:
            assert r.status == 405
