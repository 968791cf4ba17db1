"""The benchmark reads kvroute's cache model error from a real gateway's /status after a run."""

from __future__ import annotations

import math

import aiohttp

from bench.point import model_error_ratio
from tests.conftest import Emulators, StartGateway

FLAGS = ("--enable-cache-report", "--emu-time-scale", "0.001")


async def test_model_error_is_pooled_from_status(emulator_server: Emulators, gateway: StartGateway) -> None:
    emus = [await emulator_server(*FLAGS) for _ in range(2)]
    gw = await gateway([e.url for e in emus])
    doc = " ".join(f"word{i}" for i in range(3000))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/v1/models") as resp:
            model_name = (await resp.json())["data"][0]["id"]
        for question in ("one", "two", "three", "four"):
            messages = [{"role": "system", "content": doc}, {"role": "user", "content": question}]
            body = {"model": model_name, "max_tokens": 2, "messages": messages}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
        async with http.get(f"{gw.url}/status") as resp:
            model = (await resp.json())["cache_model"]
    errors = sum(a["abs_error_tokens"] for a in model.values())
    prompt = sum(a["prompt_tokens"] for a in model.values())
    assert sum(a["requests"] for a in model.values()) == 4 and prompt > 4 * 3000
    ratio = await model_error_ratio(gw.url)
    assert ratio == errors / prompt
    assert 0.0 <= ratio < 0.1  # repeats of one document: the model knows where it is
    assert math.isnan(await model_error_ratio("http://127.0.0.1:9"))  # nothing listening: no number
