"""kvroute in front of real emulated SGLang replicas (subprocess), driven by the official openai SDK.

Asserts on the emulator's side where it matters: relayed bytes equal direct ones, and a client that
leaves makes the replica count an abort (``sglang:num_aborted_requests_total``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import aiohttp
import openai
import orjson
import pytest

from bench.systems.fleet import EmulatorFleet
from tests.conftest import StartGateway, sha256

MODEL = "emu-model"
EMU_ARGS = [
    "--served-model-name",
    MODEL,
    "--enable-metrics",
    "--enable-cache-report",
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "write_back",
    "--tool-call-parser",
    "qwen25",
    "--emu-time-scale",
    "0.05",
    "--emu-debug",
]
JSON = {"Content-Type": "application/json"}
ADMIN = "admin-key"
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}


@pytest.fixture(scope="module")
def fleet() -> Iterator[EmulatorFleet]:
    with EmulatorFleet(2, EMU_ARGS) as f:
        yield f


@pytest.fixture
async def gw_url(fleet: EmulatorFleet, gateway: StartGateway) -> str:
    return (await gateway(fleet.urls, policy="round_robin", health_interval=1.0)).url


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


async def test_sdk_chat_stream_completions_n2(gw_url: str) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Summarise the plan."}]
    async with _client(gw_url) as c:
        assert [m.id for m in (await c.models.list()).data] == [MODEL]
        chat = await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)  # type: ignore[arg-type]
        assert (
            chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 8
        )
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        chunks = [ch async for ch in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == chat.usage.prompt_tokens
        assert (
            "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            == chat.choices[0].message.content
        )
        comp = await c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, n=2)
        assert [ch.index for ch in comp.choices] == [0, 1]


async def test_sdk_sync_client_and_cached_tokens(gw_url: str) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Repeat after me: cache."}]

    def run() -> list[int]:
        with openai.OpenAI(base_url=gw_url + "/v1", api_key="none", max_retries=0) as c:
            out = []
            for _ in range(4):  # round robin over 2 replicas: the 3rd and 4th hit warm caches
                r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)  # type: ignore[arg-type]
                details = r.usage.prompt_tokens_details if r.usage else None
                out.append(details.cached_tokens or 0 if details else 0)
            return out

    cached = await asyncio.to_thread(run)
    assert cached[2] > 0 and cached[3] > 0


async def test_sdk_tools_round_trip(gw_url: str) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    msgs: list[dict[str, object]] = [{"role": "user", "content": "Weather in Paris?"}]
    async with _client(gw_url) as c:
        first = await c.chat.completions.create(model=MODEL, messages=msgs, tools=tools)  # type: ignore[arg-type]
        calls = first.choices[0].message.tool_calls
        assert (
            first.choices[0].finish_reason == "tool_calls"
            and calls
            and calls[0].function.name == "get_weather"
        )  # type: ignore[union-attr]
        msgs += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        ]
        second = await c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=6)  # type: ignore[arg-type]
    assert second.choices[0].message.content


async def test_sdk_errors_are_typed(gw_url: str) -> None:
    async with _client(gw_url) as c:
        # a name no replica serves goes to the fleet's only model, as a lone SGLang would serve it
        chat = await c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        assert chat.model == "gpt-4o" and chat.choices[0].message.content  # the replica echoes the name
        with pytest.raises(openai.BadRequestError):
            await c.chat.completions.create(model=MODEL, messages=[])
        with pytest.raises(openai.BadRequestError):  # the replica's own 400 (max_tokens <= 0), relayed
            await c.completions.create(model=MODEL, prompt="x", max_tokens=-1)


RECORDED = [
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "a"}], "max_tokens": 6},
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "b"}],
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "c", "max_tokens": 6, "n": 2, "logprobs": 2}),
    ("/v1/completions", {"model": MODEL, "prompt": "d", "max_tokens": 6, "stream": True}),
    ("/generate", {"text": "e", "sampling_params": {"max_new_tokens": 6}}),
    ("/generate", {"text": "f", "sampling_params": {"max_new_tokens": 6}, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "g", "max_tokens": 0}),  # an SGLang 400
]
_VOLATILE = re.compile(
    rb'"(created|e2e_latency|ts_tic|request_received_ts|response_sent_to_client_ts)":\s*[0-9.e+-]+'
)


async def _fetch(
    s: aiohttp.ClientSession, url: str, path: str, body: dict[str, object], rid: str
) -> tuple[int, str, bytes]:
    raw = orjson.dumps({**body, "rid": rid})
    admin = {"Authorization": f"Bearer {ADMIN}"}  # a replica ignores it; the gateway flushes for its admin
    async with s.post(url + "/flush_cache", headers=admin) as r:  # the gateway fans it out to its replicas
        assert r.status == 200
    async with s.post(url + path, data=raw, headers={"Content-Type": "application/json"}) as r:
        return r.status, r.headers["Content-Type"], _VOLATILE.sub(rb'"\1":0', await r.read())


async def _logged(s: aiohttp.ClientSession, url: str, path: str) -> list[str]:
    """SHA-256 of the bodies the replica received on ``path`` (its request log, --emu-debug)."""
    async with s.get(url + "/_emu/requests", params={"path": path}) as r:
        return [e["body_sha256"] for e in (await r.json())["requests"]]


def _reshaped(direct: tuple[int, str, bytes]) -> tuple[int, str, bytes]:
    """A replica's 4xx as the gateway relays it on an OpenAI route: the same status and message, in
    OpenAI's ``{"error": {...}}`` shape (SGLang answers ``{"object": "error", ...}``)."""
    status, ctype, raw = direct
    error = {"message": orjson.loads(raw)["message"], "type": "invalid_request_error", "param": None}
    return status, ctype, orjson.dumps({"error": error | {"code": status}})


async def test_relayed_bytes_equal_direct_bytes(fleet: EmulatorFleet, gateway: StartGateway) -> None:
    backend = fleet.urls[0]
    gw = (await gateway((backend,), health_interval=1.0, admin_key=ADMIN)).url
    async with aiohttp.ClientSession() as s:
        for i, (path, body) in enumerate(RECORDED):
            before = await _logged(s, backend, path)
            direct = await _fetch(s, backend, path, body, f"rid{i}a")
            via = await _fetch(s, gw, path, body, f"rid{i}a")
            assert via == (direct if direct[0] < 400 else _reshaped(direct)), path
            sent = sha256(orjson.dumps({**body, "rid": f"rid{i}a"}))
            assert (await _logged(s, backend, path))[len(before) :] == [sent, sent], path  # byte-for-byte


async def _busy(s: aiohttp.ClientSession, urls: list[str]) -> int:
    total = 0
    for u in urls:
        async with s.get(u + "/get_load") as r:
            total += sum(rank["num_reqs"] for rank in await r.json())
    return total


async def _aborted(s: aiohttp.ClientSession, urls: list[str]) -> float:
    """Sum of sglang:num_aborted_requests_total over the replicas (their /metrics)."""
    total = 0.0
    for u in urls:
        async with s.get(u + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith("sglang:num_aborted_requests_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_aborts_upstream(gw_url: str, fleet: EmulatorFleet, stream: bool) -> None:
    """The request would keep a replica busy for ~7 s (20K decode tokens at time scale 0.05); after the
    client leaves, the replica must be idle again within a second, and count exactly one abort."""
    body: dict[str, object] = {"model": MODEL, "max_tokens": 20_000, "ignore_eos": True, "stream": stream}
    async with aiohttp.ClientSession() as s:
        aborted = await _aborted(s, fleet.urls)
        if stream:  # leave after the first chunk
            body["messages"] = [{"role": "user", "content": "go"}]
            r = await s.post(gw_url + "/v1/chat/completions", data=orjson.dumps(body), headers=JSON)
            await r.content.readuntil(b"\n\n")
            assert await _busy(s, fleet.urls) == 1
            r.close()
        else:  # leave while waiting for the whole answer
            body["prompt"] = "tok " * 4000
            task = asyncio.ensure_future(
                s.post(gw_url + "/v1/completions", data=orjson.dumps(body), headers=JSON)
            )
            t0 = time.monotonic()
            while await _busy(s, fleet.urls) == 0:
                assert not task.done(), task.result()
                assert time.monotonic() - t0 < 5.0, "the request never reached a replica"
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        t0 = time.monotonic()
        while await _busy(s, fleet.urls) > 0:
            assert time.monotonic() - t0 < 1.0, "the replica kept working after the client left"
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # an /abort_request the gateway sends after closing must not count twice
        assert await _aborted(s, fleet.urls) == aborted + 1
