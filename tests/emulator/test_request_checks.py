"""Request checks of the chat, completions and /generate routes as SGLang 0.5.10 makes them: temperature and
top_p (SamplingParams.verify), max_tokens 0 (chat: unset; completions: pydantic's 400), the cached-token
report gated by --enable-cache-report, and response_format json_object's output."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.emulator.conftest import StartEmu

FAST = ("--emu-time-scale", "0.001")
MSGS = [{"role": "user", "content": "what is in the cache"}]


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize("stream", [False, True])
async def test_negative_temperature_is_sglangs_400(
    emulator: StartEmu, http: aiohttp.ClientSession, stream: bool
) -> None:
    emu = await emulator(*FAST)
    body = {"model": "m", "messages": MSGS, "temperature": -1, "stream": stream}
    status, err = await _post(http, f"{emu.url}/v1/chat/completions", body)
    assert status == 400
    assert err == {
        "object": "error",
        "message": "temperature must be non-negative, got -1.0.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    comp = {"model": "m", "prompt": "the cache", "temperature": -0.5, "stream": stream}
    status, err = await _post(http, f"{emu.url}/v1/completions", comp)
    assert status == 400 and err["message"] == "temperature must be non-negative, got -0.5."
    status, err = await _post(
        http, f"{emu.url}/v1/chat/completions", {"model": "m", "messages": MSGS, "top_p": 0}
    )
    assert status == 400 and err["message"] == "top_p must be in (0, 1], got 0.0."
    gen = {"text": "the cache", "sampling_params": {"temperature": -2, "max_new_tokens": 2}}
    status, err = await _post(http, f"{emu.url}/generate", gen)
    assert status == 400 and err == {"error": {"message": "temperature must be non-negative, got -2."}}
    status, ok = await _post(
        http, f"{emu.url}/v1/chat/completions", {"model": "m", "messages": MSGS, "temperature": 0}
    )
    assert status == 200 and ok["choices"][0]["message"]["content"]


async def test_max_tokens_zero_and_negative(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    status, chat = await _post(
        http, f"{emu.url}/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 0}
    )
    assert status == 200 and chat["choices"][0]["finish_reason"] == "stop"  # 0 is unset: a natural length
    assert chat["usage"]["completion_tokens"] >= 16
    status, err = await _post(
        http, f"{emu.url}/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": -3}
    )
    assert status == 400 and err["message"] == "max_new_tokens must be at least 0, got -3."
    assert err["type"] == "BadRequestError"
    status, err = await _post(
        http, f"{emu.url}/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 0}
    )
    assert status == 400 and err["type"] == "Bad Request" and err["code"] == 400  # pydantic's field validator
    assert "Value error, max_tokens must be positive" in err["message"]
    assert err["message"].startswith("1 validation error for CompletionRequest\nmax_tokens\n")


@pytest.mark.parametrize("report", [False, True])
async def test_completions_report_cached_tokens_only_with_the_flag(
    emulator: StartEmu, http: aiohttp.ClientSession, report: bool
) -> None:
    emu = await emulator(*FAST, *(("--enable-cache-report",) if report else ()))
    body = {"model": "m", "prompt": "a prompt long enough to share its prefix", "max_tokens": 3}
    await _post(http, f"{emu.url}/v1/completions", body)
    _, again = await _post(http, f"{emu.url}/v1/completions", body)
    usage = again["usage"]
    expected = {"cached_tokens": usage["prompt_tokens"] - 1} if report else None
    assert usage["prompt_tokens_details"] == expected
    stream = dict(body, stream=True, stream_options={"include_usage": True})
    async with http.post(f"{emu.url}/v1/completions", json=stream) as resp:
        lines = [raw.decode().strip() for raw in [line async for line in resp.content]]
    last = orjson.loads([x for x in lines if x.startswith("data: {")][-1][6:])
    if report:
        assert last["usage"]["prompt_tokens_details"] == expected
    else:
        assert "prompt_tokens_details" not in last["usage"]  # completions' usage chunk: exclude_none


async def test_json_object_output_is_a_json_object(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    """LangChain's json_mode sends response_format json_object and parses the content as JSON."""
    emu = await emulator(*FAST)
    body = {"model": "m", "messages": MSGS, "response_format": {"type": "json_object"}, "n": 3, "seed": 7}
    status, chat = await _post(http, f"{emu.url}/v1/chat/completions", body)
    assert status == 200
    contents = [c["message"]["content"] for c in chat["choices"]]
    assert all(isinstance(orjson.loads(c), dict) for c in contents)
    assert all(c["finish_reason"] == "stop" for c in chat["choices"])
    async with http.post(f"{emu.url}/v1/chat/completions", json=dict(body, stream=True)) as resp:
        lines = [raw.decode().strip() async for raw in resp.content]
    chunks = [orjson.loads(x[6:]) for x in lines if x.startswith("data: {")]
    streamed = ["", "", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            streamed[choice["index"]] += choice["delta"]["content"] or ""
    assert streamed == contents
