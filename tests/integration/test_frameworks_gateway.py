"""LangChain (`langchain-openai`) and the OpenAI Agents SDK (`openai-agents`) pointed at the gateway,
in front of two emulated replicas, offline: the same tests as against one replica
(tests/emulator/test_frameworks.py: structured output, bound tools streamed, an agent with a function
tool and an ``output_type``, plain and streamed), plus a plain LangChain invoke and stream. The
frameworks send their own model names ("m" here, "gpt-4o"-like in real use): the fleet serves one model,
so the gateway routes any name to it, as a lone SGLang replica would accept it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from langchain_openai import ChatOpenAI

from tests.conftest import Emulators, StartGateway
from tests.emulator.test_frameworks import (  # noqa: F401 (collected again here, against the gateway)
    FAST,
    agent,
    offline,
    test_agents_sdk_run,
    test_agents_sdk_streamed_run,
    test_langchain_bind_tools,
    test_langchain_with_structured_output,
)


@dataclass(frozen=True, slots=True)
class Target:
    url: str


@pytest.fixture
async def emu(emulator_server: Emulators, gateway: StartGateway) -> Target:
    """What the framework tests call ``emu``: here the gateway's base URL."""
    replicas = [await emulator_server(*FAST), await emulator_server(*FAST)]
    return Target((await gateway([r.url for r in replicas], health_interval=0.2)).url)


async def test_langchain_invoke_and_stream(emu: Target) -> None:
    chat = ChatOpenAI(model="gpt-4o", base_url=f"{emu.url}/v1", api_key="sk-emulator", max_retries=0)  # type: ignore[arg-type]
    reply = await chat.ainvoke("Say something short.")
    assert isinstance(reply.content, str) and reply.content
    assert reply.response_metadata["model_name"] == "gpt-4o"  # the replica echoes the name sent
    chunks = [c async for c in chat.astream("Say something short.")]
    assert "".join(str(c.content) for c in chunks) == reply.content  # same prompt, same seeded answer
