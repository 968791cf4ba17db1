"""The benchmark reads kvroute's cache model error from a real gateway's /status after a run."""

from __future__ import annotations

import math

import aiohttp

from bench.point import model_error_ratio
from bench.reports.fleet_work import cache_loss
from bench.runs.replay import Record
from bench.systems.fleet import Counters
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


def test_cache_loss_is_the_evicted_share_of_the_runs_answered_prompt_tokens() -> None:
    """bench.reports.fleet_work.cache_loss: the replicas' arrival_lost_tokens_total over the prompt tokens of
    the requests that were answered (a failed request's prompt is not counted); NaN without either."""
    ok = Record(0, "t", "s", 200, "", 0.0, 0.0, 1.0, 1.0, 1.0, 1000, 0, 4, 1000, "a")
    failed = Record(1, "t", "s", 500, "reset", 0.0, 0.0, None, None, None, 5000, 0, 0, 5000, "b")
    counters = {"a": Counters(1, 0, 0, 50), "b": Counters(1, 0, 0, 150)}
    assert cache_loss([ok, failed], counters) == 200 / 1000
    assert math.isnan(cache_loss([ok], {})) and math.isnan(cache_loss([failed], counters))
    assert (Counters(3, 10, 0, 70) - Counters(1, 4, 0, 20)).lost == 50
