"""The official openai SDK (sync and async) drives kvroute in front of emulated SGLang replicas; every answer
is compared with the one the replica gives directly (the emulator's output is deterministic per prompt)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.proxy.conftest import MODEL, SYSTEM, Stack, StackFactory, wait_for

MSG = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]


def _async(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)


async def test_async_chat_completion(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    emu = stack.replicas[0]
    msgs = [SYSTEM, *MSG]
    async with _async(stack.url) as client, _async(emu.url) as direct:
        cold = await client.chat.completions.create(model=MODEL, messages=msgs)  # type: ignore[arg-type]
        before = await emu.state()
        warm = await client.chat.completions.create(model=MODEL, messages=msgs)  # type: ignore[arg-type]
        after = await emu.state()
        expected = await direct.chat.completions.create(model=MODEL, messages=msgs)  # type: ignore[arg-type]
    assert cold.choices[0].message.content == warm.choices[0].message.content
    assert warm.choices[0].message.content == expected.choices[0].message.content
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    # the usage the replica counted for this request, relayed unchanged
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached == after["cached_tokens_total"] - before["cached_tokens_total"] > 0
    assert warm.usage.prompt_tokens == after["prompt_tokens_total"] - before["prompt_tokens_total"]


async def test_sync_client_chat_and_completions(stack: Stack) -> None:
    def run(url: str) -> tuple[str | None, str]:
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            chat = client.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
            comp = client.completions.create(model=MODEL, prompt="once upon a time")
            return chat.choices[0].message.content, comp.choices[0].text

    chat_text, comp_text = await asyncio.to_thread(run, stack.url)
    assert chat_text and comp_text
    assert (chat_text, comp_text) == await asyncio.to_thread(run, stack.urls[0])


async def test_stream_with_include_usage(stack: Stack) -> None:
    async with _async(stack.url) as client, _async(stack.urls[0]) as direct:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MSG,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        whole = await direct.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason == "stop"


async def test_streamed_completions(stack: Stack) -> None:
    async with _async(stack.url) as client, _async(stack.urls[1]) as direct:
        stream = await client.completions.create(model=MODEL, prompt="abc", stream=True)
        texts = [c.choices[0].text async for c in stream]
        whole = await direct.completions.create(model=MODEL, prompt="abc")
    assert len(texts) > 1 and "".join(texts) == whole.choices[0].text


async def test_tools_round_trip(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    async with _async(stack.url) as client:
        first = await client.chat.completions.create(model=MODEL, messages=MSG, tools=tools)  # type: ignore[arg-type]
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"  # type: ignore[union-attr]
        follow = [
            *MSG,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"answer": 42})},
        ]
        second = await client.chat.completions.create(model=MODEL, messages=follow, tools=tools)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content


async def test_n_equals_two(stack: Stack) -> None:
    async with _async(stack.url) as client:
        r = await client.chat.completions.create(model=MODEL, messages=MSG, n=2)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content != r.choices[1].message.content  # two samples, one request
    assert len(await stack.generations()) == 1


async def test_models_list_union(stack_factory: StackFactory) -> None:
    stack = await stack_factory(models=[MODEL, "other-model"])
    async with _async(stack.url) as client:
        models = await client.models.list()
    assert sorted(m.id for m in models.data) == [MODEL, "other-model"]


@pytest.mark.parametrize(
    ("kwargs", "exc", "status"),
    [
        ({"model": "nope", "messages": MSG}, openai.NotFoundError, 404),
        ({"model": MODEL, "messages": []}, openai.BadRequestError, 400),
    ],
)
async def test_errors_are_typed_exceptions(
    stack_factory: StackFactory, kwargs: dict[str, object], exc: type[Exception], status: int
) -> None:
    stack = await stack_factory(single_model_fallback=False)
    async with _async(stack.url) as client:
        with pytest.raises(exc) as info:
            await client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert getattr(info.value, "status_code", None) == status


async def test_no_healthy_replica_is_503(stack: Stack) -> None:
    for replica in stack.replicas:
        await replica.fault(action="unhealthy")
    await wait_for(lambda: not any(r.healthy for r in stack.gw.fleet.replicas()))
    async with _async(stack.url) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    assert info.value.status_code == 503
