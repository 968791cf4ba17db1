"""The frameworks over kvroute's /v1/responses, replicas without a response store, offline:

- the OpenAI Agents SDK's default model (``OpenAIResponsesModel``) with a function tool: a run replays the
  whole item list each turn (a tool call, then the answer), a streamed run, and runs chained on the gateway
  (``previous_response_id``, and ``auto_previous_response_id`` within a run) and in a conversation;
- LangChain ``ChatOpenAI(use_responses_api=True)``: invoke and stream, plain and chained on the gateway
  (``use_previous_response_id``).
The frameworks send their own model names: the fleet serves one model, so the gateway routes any name to
it and echoes the name the client sent.
"""

from __future__ import annotations

from typing import Any, Literal

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, ToolCallOutputItem, function_tool
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.emulator.test_frameworks import offline  # noqa: F401 (autouse: a dummy key, tracing off)
from tests.proxy.conftest import SYSTEM, Stack

LONG = str(SYSTEM["content"])


class Forecast(BaseModel):
    city: str
    sky: Literal["sunny", "cloudy", "rain"]
    high_c: int


@function_tool
def lookup_weather(city: str) -> str:
    """Look the weather of a city up."""
    return f"{city}: sunny, 24 C"


def _agent(sdk: AsyncOpenAI, output: type[BaseModel] | None = Forecast) -> Agent[Any]:
    return Agent(
        name="forecaster",
        instructions=LONG + " Look the weather up, then answer.",
        model=OpenAIResponsesModel(model="gpt-4o", openai_client=sdk),
        tools=[lookup_weather],
        output_type=output,
        model_settings=ModelSettings(include_usage=True),
    )


async def test_agents_sdk_with_a_function_tool(sdk: AsyncOpenAI) -> None:
    result = await Runner.run(_agent(sdk), "Weather in Paris?", max_turns=4)
    assert isinstance(result.final_output, Forecast)
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert len(outputs) == 1 and outputs[0].endswith(": sunny, 24 C")
    cached = [r.usage.input_tokens_details.cached_tokens for r in result.raw_responses]
    assert len(cached) == 2 and cached[-1] > 0  # the second turn replays the first: its prefix is cached
    streamed = Runner.run_streamed(_agent(sdk), "Weather in Paris?", max_turns=4)
    async for _event in streamed.stream_events():
        pass
    assert streamed.final_output == result.final_output


async def test_agents_sdk_chained_on_the_gateway(sdk: AsyncOpenAI, stack: Stack) -> None:
    agent = _agent(sdk, output=None)
    first = await Runner.run(agent, "Weather in Paris?", max_turns=4, auto_previous_response_id=True)
    assert first.last_response_id is not None and len(first.raw_responses) == 2
    chained = [r.response_id for r in first.raw_responses]
    stored = await sdk.responses.retrieve(str(chained[1]))
    assert stored.previous_response_id == chained[0]  # the tool round went through the gateway's chain
    second = await Runner.run(agent, "And in Rome?", max_turns=4, previous_response_id=first.last_response_id)
    assert isinstance(second.final_output, str) and second.final_output
    usage = second.raw_responses[0].usage
    assert usage.input_tokens_details.cached_tokens > 0  # the chain, expanded by the gateway, is cached
    conv = await sdk.conversations.create()
    for question in ("Weather in Oslo?", "And tomorrow?"):
        ran = await Runner.run(agent, question, max_turns=4, conversation_id=conv.id)
        assert ran.final_output
    items = [i async for i in sdk.conversations.items.list(conv.id, order="asc")]
    assert [i.type for i in items].count("function_call") >= 1 and len(items) >= 6


async def test_langchain_over_the_responses_api(stack: Stack, sdk: AsyncOpenAI) -> None:
    def chat(**extra: Any) -> ChatOpenAI:
        return ChatOpenAI(
            model="gpt-4o",
            base_url=f"{stack.url}/v1",
            api_key="sk-emulator",  # type: ignore[arg-type]
            max_retries=0,
            use_responses_api=True,
            **extra,
        )

    model = chat()
    reply = await model.ainvoke("Say something short.")
    assert isinstance(reply, AIMessage) and reply.text and reply.response_metadata["model_name"] == "gpt-4o"
    assert str(reply.response_metadata["id"]).startswith("resp_")
    chunks = [c async for c in model.astream("Say something short.")]
    assert "".join(c.text for c in chunks) == reply.text  # same prompt, same seeded answer
    chained = chat(use_previous_response_id=True)
    first = await chained.ainvoke([HumanMessage(LONG + " Name a colour.")])
    follow = await chained.ainvoke(
        [HumanMessage(LONG + " Name a colour."), first, HumanMessage("Another one?")]
    )
    assert follow.text and follow.usage_metadata is not None
    assert follow.usage_metadata["input_token_details"].get("cache_read", 0) > 0
    stored = await sdk.responses.retrieve(str(follow.response_metadata["id"]))
    assert stored.previous_response_id == first.response_metadata["id"]  # LangChain sent only the new turn
