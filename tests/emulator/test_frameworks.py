"""What a new user drives the emulator with: LangChain (`langchain-openai`) and the OpenAI Agents SDK
(`openai-agents`), straight against one emulated replica, offline.

LangChain: `with_structured_output(Model)` (its default json_schema method) returns a model instance;
`bind_tools` gets a tool call whose arguments fit the tool's schema, streamed too. Agents SDK (chat
completions model, tracing off): an agent with a function tool and `output_type` calls the tool, reads
its result and ends with a valid `output_type` instance, in a plain and in a streamed run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from tests.emulator.conftest import Emu, StartEmu

FAST = ("--emu-time-scale", "0.001")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dummy key and every tracing/telemetry exporter off: nothing may leave the machine."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-emulator")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "false")
    set_tracing_disabled(True)


@pytest.fixture
async def emu(emulator: StartEmu) -> Emu:
    return await emulator(*FAST)


class Forecast(BaseModel):
    city: str
    sky: Literal["sunny", "cloudy", "rain"]
    high_c: int = Field(ge=-40, le=50)
    hours: list[int]
    warning: str | None


# ---- LangChain ------------------------------------------------------------------------------
def _chat(emu: Emu) -> ChatOpenAI:
    return ChatOpenAI(model="m", base_url=f"{emu.url}/v1", api_key="sk-emulator", max_retries=0)  # type: ignore[arg-type]


@tool
def get_weather(city: str, days: int) -> str:
    """The weather of a city for the next days."""
    return f"sunny in {city} for {days} days"


async def test_langchain_with_structured_output(emu: Emu) -> None:
    structured = _chat(emu).with_structured_output(Forecast)
    first = await structured.ainvoke("Weather in Paris?")
    assert isinstance(first, Forecast)
    again = await structured.ainvoke("Weather in Paris?")
    assert again == first
    raw = _chat(emu).with_structured_output(Forecast, include_raw=True)
    out: Any = await raw.ainvoke("Weather in Rome?")
    assert isinstance(out["parsed"], Forecast) and out["parsing_error"] is None
    assert out["raw"].response_metadata["finish_reason"] == "stop"


async def test_langchain_bind_tools(emu: Emu) -> None:
    bound = _chat(emu).bind_tools([get_weather])
    msg = await bound.ainvoke("Weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "days"}
    assert get_weather.invoke(call["args"]).startswith("sunny in")  # the arguments fit the tool's schema
    merged: AIMessageChunk | None = None
    async for chunk in bound.astream("Weather in Paris?"):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and [c["name"] for c in merged.tool_calls] == ["get_weather"]
    assert merged.tool_calls[0]["args"] == call["args"]  # streamed = non-stream, same request


# ---- OpenAI Agents SDK ----------------------------------------------------------------------
@function_tool
def lookup_weather(city: str) -> str:
    """Look up today's weather of a city."""
    return f"{city}: sunny, 24 C"


@pytest.fixture
async def agent(emu: Emu) -> AsyncIterator[Agent[Any]]:
    client = AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="sk-emulator", max_retries=0)
    model = OpenAIChatCompletionsModel(model="m", openai_client=client)
    yield Agent(
        name="forecaster",
        instructions="Answer with a forecast; look the weather up first.",
        model=model,
        tools=[lookup_weather],
        output_type=Forecast,
        model_settings=ModelSettings(include_usage=True),
    )
    await client.close()


def _tool_outputs(items: list[Any]) -> list[Any]:
    return [i.output for i in items if isinstance(i, ToolCallOutputItem)]


async def test_agents_sdk_run(agent: Agent[Any]) -> None:
    result = await Runner.run(agent, "Weather in Paris?", max_turns=4)
    assert isinstance(result.final_output, Forecast)
    (output,) = _tool_outputs(result.new_items)  # the tool ran once, then the model answered
    assert output.endswith(": sunny, 24 C")
    assert sum(r.usage.output_tokens for r in result.raw_responses) > 0


async def test_agents_sdk_streamed_run(agent: Agent[Any]) -> None:
    streamed = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
    kinds = [event.type async for event in streamed.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert isinstance(streamed.final_output, Forecast)
    assert len(_tool_outputs(streamed.new_items)) == 1
    plain = await Runner.run(agent, "Weather in Paris?", max_turns=4)
    assert streamed.final_output == plain.final_output  # the same conversation, the same answer
