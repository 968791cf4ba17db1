"""The real openai SDK (and the Agents SDK's Responses model) against the emulator's /v1/responses:
create, create(stream=True) to completion, the strict `responses.stream()` helper, retrieve with the store
on, the 400 with it off, tool calls and `responses.parse` with a Pydantic model."""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import FunctionToolParam, ResponseFunctionToolCall, ResponseOutputMessage
from pydantic import BaseModel

from tests.emulator.conftest import Emu, StartEmu

FAST = ("--emu-time-scale", "0.001")
MODEL = "kvroute-emu"
ASK = "explain what a radix cache keeps between two chat turns"
TOOL: FunctionToolParam = {
    "type": "function",
    "name": "lookup",
    "description": "look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    "strict": True,
}


def _client(emu: Emu) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none", max_retries=0)


async def test_create_stream_and_the_stream_helper(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with _client(emu) as client:
        first = await client.responses.create(model=MODEL, input=ASK, instructions="Be brief.")
        assert first.status == "completed" and first.output_text and first.id.startswith("resp_")
        assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
        again = await client.responses.create(model=MODEL, input=ASK, instructions="Be brief.")
        assert again.output_text == first.output_text  # same prompt, same answer
        assert (
            again.usage is not None
            and again.usage.input_tokens_details.cached_tokens == again.usage.input_tokens - 1
        )
        stream = await client.responses.create(model=MODEL, input=ASK, stream=True, max_output_tokens=12)
        kinds, text, final = [], "", None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        assert (
            kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
        )
        assert final is not None and final.output_text == text and final.usage is not None
        assert final.usage.output_tokens == 10
        async with client.responses.stream(model=MODEL, input=ASK, instructions="Be brief.") as helper:
            async for _event in helper:
                pass
            done = await helper.get_final_response()
        assert done.output_text == first.output_text and done.status == "completed"


async def test_tool_calls_round_trip(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with _client(emu) as client:
        called = await client.responses.create(model=MODEL, input=ASK, tools=[TOOL])
        (call,) = called.output
        assert isinstance(call, ResponseFunctionToolCall) and call.name == "lookup"
        assert isinstance(json.loads(call.arguments)["word"], str)
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "a tree of prefixes"}
        items: Any = [{"role": "user", "content": ASK}, call.model_dump(), result]  # the replayed turn
        answer = await client.responses.create(model=MODEL, input=items, tools=[TOOL])
        assert isinstance(answer.output[0], ResponseOutputMessage) and answer.output_text
        assert answer.usage is not None and answer.usage.input_tokens_details.cached_tokens > 0
        async with client.responses.stream(model=MODEL, input=ASK, tools=[TOOL]) as helper:
            streamed = await helper.get_final_response()
        assert isinstance(streamed.output[0], ResponseFunctionToolCall)


async def test_retrieve_with_the_store_and_the_400_without(emulator: StartEmu) -> None:
    stored = await emulator(*FAST, "--enable-response-store")
    async with _client(stored) as client:
        first = await client.responses.create(model=MODEL, input=ASK, max_output_tokens=10)
        got = await client.responses.retrieve(first.id)
        assert got.model_dump() == first.model_dump()
        follow = await client.responses.create(model=MODEL, input="go on", previous_response_id=first.id)
        assert follow.previous_response_id == first.id and follow.usage is not None
        assert follow.usage.input_tokens_details.cached_tokens == first.usage.total_tokens  # type: ignore[union-attr]
    plain = await emulator(*FAST)
    async with _client(plain) as client:
        first = await client.responses.create(model=MODEL, input=ASK, max_output_tokens=4)
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.retrieve(first.id)
        assert "Response store is disabled" in info.value.message
        assert isinstance(info.value.body, dict) and info.value.body["param"] == "response_id"
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model=MODEL, input="go on", previous_response_id=first.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="gpt-x", input=ASK)


class Forecast(BaseModel):
    city: str
    sky: Literal["sunny", "cloudy", "rain"]
    high_c: int


async def test_parse_with_a_pydantic_model(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with _client(emu) as client:
        parsed = await client.responses.parse(model=MODEL, input=ASK, text_format=Forecast)
        assert isinstance(parsed.output_parsed, Forecast)


@function_tool
def lookup_weather(city: str) -> str:
    """Look the weather of a city up."""
    return f"{city}: sunny, 24 C"


async def test_agents_sdk_over_the_responses_api(emulator: StartEmu, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Agents SDK's default model: the full item list each turn, strict tools, a json_schema output."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    set_tracing_disabled(True)
    emu = await emulator(*FAST)
    async with _client(emu) as client:
        agent: Agent[Any] = Agent(
            name="forecaster",
            instructions="Look the weather up, then answer with a forecast.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[lookup_weather],
            output_type=Forecast,
            model_settings=ModelSettings(include_usage=True),
        )
        result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
        assert isinstance(result.final_output, Forecast)
        outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        assert len(outputs) == 1 and outputs[0].endswith(": sunny, 24 C")
        cached = [r.usage.input_tokens_details.cached_tokens for r in result.raw_responses]
        assert cached[-1] > 0  # the second turn replays the first: its prefix is cached
        streamed = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
        async for _event in streamed.stream_events():
            pass
        assert streamed.final_output == result.final_output
