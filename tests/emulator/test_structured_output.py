"""Structured output over HTTP (chat, completions, /generate): schema-valid JSON that ends with "stop",
cut by max tokens with "length", deterministic, counted and cached with the emulator's tokenizer."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from jsonschema import Draft202012Validator

from tests.emulator.conftest import StartEmu
from tests.emulator.test_api import _sse

FAST = ("--emu-time-scale", "0.001", "--enable-cache-report")
SCHEMA: dict[str, Any] = {
    "$defs": {
        "Step": {
            "type": "object",
            "properties": {"tool": {"enum": ["grep", "read"]}, "why": {"type": "string"}},
            "required": ["tool", "why"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["answer", "confidence", "steps", "note"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Plan", "schema": SCHEMA, "strict": True}}
MSGS = [{"role": "user", "content": "plan the search"}]


def _valid(text: str) -> Any:
    value = orjson.loads(text)
    Draft202012Validator(SCHEMA).validate(value)
    return value


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_chat_json_schema_is_valid_stops_and_is_reused(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAST)
    url = f"{emu.url}/v1/chat/completions"
    body = {"model": "m", "messages": MSGS, "response_format": FORMAT}
    _, first = await _post(http, url, body)
    choice = first["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == 151645  # EOS after the JSON
    content = choice["message"]["content"]
    _valid(content)
    assert first["usage"]["completion_tokens"] == len(emu.replica.tokenizer.encode(content))
    _, again = await _post(http, url, body)
    assert again["choices"][0]["message"]["content"] == content  # deterministic per request
    follow = [*MSGS, {"role": "assistant", "content": content}, {"role": "user", "content": "go on"}]
    _, second = await _post(http, url, dict(body, messages=follow))
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]  # prompt + JSON
    _, seeded = await _post(http, url, dict(body, seed=5))
    assert seeded["choices"][0]["message"]["content"] != content


async def test_max_tokens_cuts_the_json(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    url = f"{emu.url}/v1/chat/completions"
    body = {"model": "m", "messages": MSGS, "response_format": FORMAT}
    _, full = await _post(http, url, body)
    _, cut = await _post(http, url, dict(body, max_tokens=5))
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 5
    assert full["choices"][0]["message"]["content"].startswith(cut["choices"][0]["message"]["content"])
    _, roomy = await _post(http, url, dict(body, max_tokens=10_000))
    assert roomy["choices"][0]["finish_reason"] == "stop"
    assert roomy["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"]


async def test_chat_stream_and_json_object(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    url = f"{emu.url}/v1/chat/completions"
    body = {"model": "m", "messages": MSGS, "response_format": FORMAT, "stream": True}
    async with http.post(url, json=body) as resp:
        chunks = [e for e in await _sse(resp) if e != "[DONE]"]
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    _valid(text)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    _, obj = await _post(
        http, url, {"model": "m", "messages": MSGS, "response_format": {"type": "json_object"}}
    )
    assert isinstance(orjson.loads(obj["choices"][0]["message"]["content"]), dict)
    _, plain = await _post(http, url, {"model": "m", "messages": MSGS, "response_format": {"type": "text"}})
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(plain["choices"][0]["message"]["content"])


async def test_completions_and_generate_take_json_schema(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAST)
    text = orjson.dumps(SCHEMA).decode()
    base = {"model": "m", "prompt": "a plan:", "max_tokens": 2000}
    for extra in ({"response_format": FORMAT}, {"json_schema": text}):
        status, out = await _post(http, f"{emu.url}/v1/completions", base | extra)
        assert status == 200 and out["choices"][0]["finish_reason"] == "stop"
        _valid(out["choices"][0]["text"])
    native = {"text": "a plan:", "sampling_params": {"json_schema": text, "max_new_tokens": 2000}}
    _, gen = await _post(http, f"{emu.url}/generate", native)
    _valid(gen["text"])
    assert gen["meta_info"]["finish_reason"] == {"type": "stop", "matched": 151645}


@pytest.mark.parametrize(
    ("path", "extra", "words"),
    [
        ("/v1/chat/completions", {"regex": "a+"}, "'regex' constraints are not modelled"),
        ("/v1/chat/completions", {"ebnf": "root ::= 'a'"}, "'ebnf' constraints are not modelled"),
        ("/v1/chat/completions", {"response_format": {"type": "structural_tag"}}, "'structural_tag'"),
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ("/v1/completions", {"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ("/v1/completions", {"json_schema": '{"type": "string", "pattern": "^a"}'}, "'pattern' keyword"),
        ("/generate", {"sampling_params": {"regex": "a+"}}, "'regex' constraints are not modelled"),
    ],
)
async def test_unmodelled_constraints_are_a_clear_400(
    emulator: StartEmu, http: aiohttp.ClientSession, path: str, extra: dict[str, Any], words: str
) -> None:
    emu = await emulator(*FAST)
    base: dict[str, Any] = {"model": "m", "messages": MSGS, "prompt": "x", "text": "x"}
    if path == "/generate":
        base = {"text": "x"}
    status, err = await _post(http, f"{emu.url}{path}", base | extra)
    assert status == 400
    message = err["error"]["message"] if path == "/generate" else err["message"]
    assert words in message
