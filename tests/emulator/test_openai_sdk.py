"""The official openai SDK (sync and async) parses every emulator response shape, errors included, and its
structured-output helpers (`parse` with a Pydantic model) get valid instances."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import (
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from pydantic import BaseModel, Field

from tests.emulator.conftest import StartEmu

FAST = ("--emu-time-scale", "0.001", "--enable-cache-report", "--tool-call-parser", "qwen25")
MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say something about caches"}]
TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


async def test_async_chat_stream_completions(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none") as client:
        chat = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=6)
        assert chat.choices[0].message.content and chat.usage is not None
        assert chat.usage.completion_tokens == 6 and chat.choices[0].finish_reason == "length"
        again = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=6)
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        stream = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finishes = "", None, []
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
            usage = chunk.usage or usage
        assert text == chat.choices[0].message.content  # same prompt, same seed → same text
        assert finishes == ["length"] and usage is not None and usage.completion_tokens == 6
        comp = await client.completions.create(model="m", prompt="the cache", max_tokens=4, n=2, logprobs=2)
        assert len(comp.choices) == 2 and comp.choices[0].text != comp.choices[1].text
        lp = comp.choices[0].logprobs
        assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
        assert lp.top_logprobs is not None and len(lp.top_logprobs[0]) == 2


async def test_async_logprobs_n_and_tools(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none") as client:
        chat = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=3,
            n=2,
            logprobs=True,
            top_logprobs=2,
        )
        assert [c.index for c in chat.choices] == [0, 1]
        logprobs = chat.choices[0].logprobs
        content = logprobs.content if logprobs is not None else None
        assert content is not None and len(content) == 3 and len(content[0].top_logprobs) == 2
        assert chat.usage is not None and chat.usage.completion_tokens == 6
        call = await client.chat.completions.create(model="m", messages=MSGS, tools=[TOOL])
        tool_calls = call.choices[0].message.tool_calls
        assert call.choices[0].finish_reason == "tool_calls" and tool_calls
        first = tool_calls[0]
        assert isinstance(first, ChatCompletionMessageFunctionToolCall)
        assert first.function.name == "lookup" and "word" in json.loads(first.function.arguments)
        stream = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            tools=[TOOL],
            stream=True,
        )
        name, args, finish = "", "", None
        async for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    name += (delta.function.name or "") if delta.function else ""
                    args += (delta.function.arguments or "") if delta.function else ""
                finish = choice.finish_reason or finish
        assert name == "lookup" and json.loads(args) and finish == "tool_calls"


async def test_async_errors_are_typed(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, "--context-length", "32")
    async with AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(model="m", prompt="word " * 50, max_tokens=2)
        assert "context length" in str(info.value)
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no-such-model")
        models = await client.models.list()
        assert models.data[0].owned_by == "sglang"
    secured = await emulator("--emu-time-scale", "0.001", "--api-key", "sk-1")
    async with AsyncOpenAI(base_url=f"{secured.url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


def _sync_calls(base_url: str) -> tuple[str, str]:
    with OpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        chat = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
        pieces = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, stream=True)
            if c.choices
        ]
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="m", prompt="x", max_tokens=-1)
        return chat.choices[0].message.content or "", "".join(pieces)


async def test_sync_client(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    full, streamed = await asyncio.to_thread(_sync_calls, f"{emu.url}/v1")
    assert full and full == streamed


class Step(BaseModel):
    tool: Literal["grep", "read"]
    why: str


class Plan(BaseModel):
    """A strict structured output: nested model, list, enum, optional (anyOf null)."""

    goal: str
    steps: list[Step]
    budget: int = Field(ge=1, le=10)
    note: str | None


async def test_parse_with_a_pydantic_model(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    async with AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="none", max_retries=0) as client:
        beta = await client.beta.chat.completions.parse(model="m", messages=MSGS, response_format=Plan)
        parsed = beta.choices[0].message.parsed
        assert isinstance(parsed, Plan) and beta.choices[0].finish_reason == "stop"
        again = await client.chat.completions.parse(model="m", messages=MSGS, response_format=Plan)
        assert again.choices[0].message.parsed == parsed  # same request, same output
        async with client.beta.chat.completions.stream(
            model="m", messages=MSGS, response_format=Plan, seed=3
        ) as stream:
            final = await stream.get_final_completion()
        streamed = final.choices[0].message.parsed
        assert isinstance(streamed, Plan) and streamed != parsed
        with pytest.raises(openai.LengthFinishReasonError):  # cut by max tokens: the SDK's own error
            await client.chat.completions.parse(model="m", messages=MSGS, response_format=Plan, max_tokens=4)
