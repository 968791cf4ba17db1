"""The official sglang-router (0.3.2) accepts 3 emulated replicas as workers and routes through them.

This is our check that the emulator looks like SGLang to a real peer: the router registers each worker
(GET /health, /server_info, /model_info) under its served_model_name (the emulator's short default id),
loads the tokenizer named by the worker's model_path (the shipped local emulator/model directory: never
a hub download, HF_HUB_OFFLINE=1), and proxies chat, streaming chat and completions, which the official
openai SDK parses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from emulator.config import MODEL_DIR
from emulator.launcher import EmulatorFleet, free_ports, stop_process

pytestmark = pytest.mark.slow
MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "route me through the router please"}]


@pytest.fixture(scope="module")
def fleet() -> Iterator[EmulatorFleet]:
    with EmulatorFleet(3, ["--emu-time-scale", "0.01", "--emu-debug", "--enable-cache-report"]) as fleet:
        yield fleet


def _wait_ready(url: str, proc: subprocess.Popen[bytes], workers: int, timeout: float = 30.0) -> None:
    """The router listens before its workers are registered (in the background, ~50 ms each) and its
    /health says OK at once; /readiness counts the healthy workers, so wait for all of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "router exited"
        try:
            with urllib.request.urlopen(f"{url}/readiness", timeout=2) as resp:
                if json.load(resp).get("healthy_workers") == workers:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError("sglang-router did not become ready")


@pytest.fixture
def router(fleet: EmulatorFleet, request: pytest.FixtureRequest) -> Iterator[str]:
    port, metrics_port = free_ports(2)
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--worker-urls", *fleet.urls, "--policy", request.param, "--log-level", "warn"]
    cmd += ["--prometheus-port", str(metrics_port)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, len(fleet.urls))
        yield url
    finally:
        stop_process(proc)


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
        stream = await client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            text += "".join(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
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
