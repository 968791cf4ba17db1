"""The official sglang-router (0.3.2) accepts 3 emulated replicas as workers and routes through them.

This is our check that the emulator looks like SGLang to a real peer: the router registers each worker
(GET /health, /server_info, /model_info) under its served_model_name (the emulator's short default id),
loads the tokenizer named by the worker's model_path (the shipped local emulator/model directory: never
a hub download, HF_HUB_OFFLINE=1), and proxies chat, streaming chat and completions, which the official
openai SDK parses.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from emulator.config import MODEL_DIR
from tests.emulator.sdk import streamed_chat

pytestmark = pytest.mark.slow
MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "route me through the router please"}]


@pytest.fixture(scope="module")
def fleet() -> Iterator[EmulatorFleet]:
    with EmulatorFleet(3, ["--emu-time-scale", "0.01", "--emu-debug", "--enable-cache-report"]) as fleet:
        yield fleet


@pytest.fixture
def router(fleet: EmulatorFleet, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """sglang-router from the benchmark's command template, ready once /readiness counts every worker
    healthy (it listens, and says OK on /health, before it has registered them)."""
    system = systems.select([f"sglang-{request.param}"])[0]
    with systems.system_process(system, fleet.urls, tmp_path / "router.log") as proc:
        yield proc.urls[0]


def _requests_per_worker(fleet: EmulatorFleet) -> list[int]:
    counts = []
    for url in fleet.urls:
        with urllib.request.urlopen(f"{url}/_emu/state", timeout=5) as resp:
            counts.append(int(json.load(resp)["requests_total"]))
    return counts


async def _traffic(router: str) -> None:
    async with AsyncOpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0) as client:
        chat = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
        assert chat.choices[0].message.content and chat.usage is not None
        text, usage = await streamed_chat(client, MSGS, 4)
        assert text == chat.choices[0].message.content and usage is not None
        comp = await client.completions.create(model="m", prompt="the router sends this", max_tokens=3)
        assert comp.choices[0].text and comp.usage is not None and comp.usage.completion_tokens == 3


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


@pytest.mark.parametrize("router", ["round_robin"], indirect=True)
async def test_round_robin_spreads_over_workers(router: str, fleet: EmulatorFleet) -> None:
    workers = _get(f"{router}/workers")["workers"]
    assert len(workers) == 3 and {w["model_id"] for w in workers} == {"kvroute-emu"}  # the short default id
    assert {w["metadata"]["model_path"] for w in workers} == {str(MODEL_DIR)}  # its tokenizer directory
    assert [m["id"] for m in _get(f"{router}/v1/models")["data"]] == ["kvroute-emu"]
    before = _requests_per_worker(fleet)
    for _ in range(2):
        await _traffic(router)
    after = _requests_per_worker(fleet)
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2, 2]


@pytest.mark.parametrize("router", ["cache_aware"], indirect=True)
async def test_cache_aware_keeps_a_prefix_on_one_worker(router: str, fleet: EmulatorFleet) -> None:
    before = _requests_per_worker(fleet)
    await _traffic(router)
    async with AsyncOpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0) as client:
        for _ in range(4):
            chat = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=2)
            details = chat.usage.prompt_tokens_details if chat.usage else None
            assert details is not None and details.cached_tokens  # served where the prefix is cached
    delta = [a - b for a, b in zip(_requests_per_worker(fleet), before, strict=True)]
    assert sum(delta) == 7 and max(delta) >= 6
