"""The official sglang-router takes an ``--emu-tokenizer hf`` replica whose model path is emulator/model_bpe:
it loads that directory's tokenizer (local files only, HF_HUB_OFFLINE=1) and routes chat through it, and
the prompt tokens the replica reports are the ones that tokenizer gives the rendered chat."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from bench.systems import registry as systems
from bench.systems.fleet import EmulatorFleet
from emulator.hf_tokenizer import HfTokenizer

pytestmark = pytest.mark.slow
BPE = Path(__file__).resolve().parents[2] / "emulator" / "model_bpe"
MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "route me with the real tokenizer"}]


async def test_sglang_router_loads_the_bpe_directory(tmp_path: Path) -> None:
    flags = ["--emu-tokenizer", "hf", "--model-path", str(BPE), "--emu-time-scale", "0.01"]
    system = systems.select(["sglang-cache_aware"])[0]
    with (
        EmulatorFleet(1, flags) as fleet,
        systems.system_process(system, fleet.urls, tmp_path / "router.log") as proc,
    ):
        async with aiohttp.ClientSession() as http, http.get(f"{proc.urls[0]}/workers") as resp:
            workers = (await resp.json())["workers"]
        assert [w["metadata"]["model_path"] for w in workers] == [str(BPE)]
        async with AsyncOpenAI(base_url=f"{proc.urls[0]}/v1", api_key="none", max_retries=0) as client:
            chat = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=3)
    want = HfTokenizer(BPE).chat_ids([dict(m) for m in MSGS], None, {})
    assert chat.usage is not None and chat.usage.prompt_tokens == len(want)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 3
