"""What several emulator tests do with the real openai SDK."""

from __future__ import annotations

from collections.abc import Sequence

from openai import AsyncOpenAI
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam


async def streamed_chat(
    client: AsyncOpenAI, messages: Sequence[ChatCompletionMessageParam], max_tokens: int
) -> tuple[str, CompletionUsage | None]:
    """A streamed chat completion with usage: its text joined, and the usage chunk's usage."""
    stream = await client.chat.completions.create(
        model="m",
        messages=list(messages),
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    async for chunk in stream:
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    return text, usage
