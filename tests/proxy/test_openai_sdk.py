"""The official openai SDK (sync and async) drives kvroute in front of SGLang-shaped replicas."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from proxy.context import GATEWAY
from tests.proxy.conftest import Stack, wait_for

MSG = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]


def _async(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)


async def test_async_chat_completion(stack: Stack) -> None:
    async with _async(stack) as client:
        r = await client.chat.completions.create(model="fake-model", messages=MSG)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens // 2


async def test_sync_client_chat_and_completions(stack: Stack) -> None:
    def run() -> tuple[str | None, str]:
        with openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0) as client:
            chat = client.chat.completions.create(model="fake-model", messages=MSG)  # type: ignore[arg-type]
            comp = client.completions.create(model="fake-model", prompt="once upon a time")
            return chat.choices[0].message.content, comp.choices[0].text

    chat_text, comp_text = await asyncio.to_thread(run)
    assert chat_text == comp_text == "tok0 tok1 tok2 tok3 "


async def test_stream_with_include_usage(stack: Stack) -> None:
    async with _async(stack) as client:
        stream = await client.chat.completions.create(
            model="fake-model",
            messages=MSG,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok0 tok1 tok2 tok3 "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chunks[-2].choices[0].finish_reason == "stop"


async def test_streamed_completions(stack: Stack) -> None:
    async with _async(stack) as client:
        stream = await client.completions.create(model="fake-model", prompt="abc", stream=True)
        texts = [c.choices[0].text async for c in stream]
    assert "".join(texts) == "tok0 tok1 tok2 tok3 "


async def test_tools_round_trip(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    async with _async(stack) as client:
        first = await client.chat.completions.create(model="fake-model", messages=MSG, tools=tools)  # type: ignore[arg-type]
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"  # type: ignore[union-attr]
        follow = [
            *MSG,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"answer": 42})},
        ]
        second = await client.chat.completions.create(model="fake-model", messages=follow, tools=tools)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content


async def test_n_equals_two(stack: Stack) -> None:
    async with _async(stack) as client:
        r = await client.chat.completions.create(model="fake-model", messages=MSG, n=2)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1]


async def test_models_list_union(stack: Stack) -> None:
    stack.replicas[1].model = "other-model"
    async with _async(stack) as client:
        models = await client.models.list()
    assert {m.id for m in models.data} == {"fake-model", "other-model"}


@pytest.mark.parametrize(
    ("kwargs", "exc", "status"),
    [
        ({"model": "nope", "messages": MSG}, openai.NotFoundError, 404),
        ({"model": "fake-model", "messages": []}, openai.BadRequestError, 400),
    ],
)
async def test_errors_are_typed_exceptions(
    stack: Stack, kwargs: dict[str, object], exc: type[Exception], status: int
) -> None:
    async with _async(stack) as client:
        with pytest.raises(exc) as info:
            await client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert getattr(info.value, "status_code", None) == status


async def test_no_healthy_replica_is_503(stack: Stack) -> None:
    for replica in stack.replicas:
        replica.healthy = False
    await wait_for(lambda: not any(r.healthy for r in stack.app[GATEWAY].fleet.replicas()))
    async with _async(stack) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="fake-model", messages=MSG)  # type: ignore[arg-type]
    assert info.value.status_code == 503
