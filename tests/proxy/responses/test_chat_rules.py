"""What applies to chat applies to /v1/responses: a tenant's salt in the ``cache_salt`` a replica gets
(and the reserved prefix refused without one), its rate limits, ``max_messages`` on the expanded input,
the response cache's bypass, and exact mode's token ids from the chat the turn renders as."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tests.conftest import Emulators, StartGateway
from tests.proxy.conftest import ADMIN, EMU_FLAGS, MODEL, StackFactory
from tests.proxy.recorder import Recorder
from tests.proxy.responses.conftest import ASK, client

BPE = Path(__file__).resolve().parents[3] / "emulator" / "model_bpe"
KEYS = json.dumps([{"key": "sk-acme", "tenant": "acme", "requests_per_minute": 3}])


async def test_tenants_are_salted_and_limited(emulator_server: Emulators, gateway: StartGateway) -> None:
    recorder = Recorder((await emulator_server(*EMU_FLAGS)).url)
    async with recorder.running() as url:
        gw = await gateway([url], api_keys=KEYS, health_interval=0.1)
        async with client(gw.url, "sk-acme") as sdk:
            first = await sdk.responses.create(model=MODEL, input=ASK, max_output_tokens=8)
            await sdk.responses.create(model=MODEL, input="more", previous_response_id=first.id)
            await sdk.responses.create(model=MODEL, input="x", extra_body={"cache_salt": "mine"})
            with pytest.raises(openai.RateLimitError):
                await sdk.responses.create(model=MODEL, input="one too many")
    sent = [orjson.loads(s.body) for s in recorder.client_requests() if s.path == "/v1/responses"]
    assert len(sent) == 3 and all(b["cache_salt"].startswith("kvroute-tenant-") for b in sent)
    assert sent[2]["cache_salt"].endswith(":mine")


async def test_limits_cache_bypass_and_exact_mode(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, max_messages=4, response_cache="memory", tokenizer_path=str(BPE))
    async with client(stack.url) as sdk:
        raw = await sdk.responses.with_raw_response.create(model=MODEL, input=ASK, temperature=0)
        assert raw.headers["x-kvroute-cache"] == "bypass"  # never a cached Responses answer
        first = raw.parse()
        second = await sdk.responses.create(model=MODEL, input="and?", previous_response_id=first.id)
        with pytest.raises(openai.BadRequestError) as many:  # 2 + 2 items before it, 1 now
            await sdk.responses.create(model=MODEL, input="and then?", previous_response_id=second.id)
        assert many.value.code == "too_many_messages" and many.value.body["param"] == "input"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):
            await sdk.responses.create(model=MODEL, input="x", extra_body={"cache_salt": "kvroute-tenant-x"})
    tokenizer = (await _status(stack.url))["tokenizer"]
    assert tokenizer["tokenized"] >= 2 and not tokenizer["fallback"]  # keyed by the engine's token ids


async def _status(url: str) -> Any:
    headers = {"Accept": "application/json"} | ADMIN
    async with aiohttp.ClientSession() as s, s.get(url + "/status", headers=headers) as r:
        assert r.status == 200
        return await r.json()
