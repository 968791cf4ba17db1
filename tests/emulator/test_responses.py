"""/v1/responses against SGLang 0.5.23's contract (responses-contract §1, §5): the object, input items
rendered as chat (same tokens, same prefix cache), tool calls, errors, the event stream, and the store."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from emulator.config import MODEL_DIR
from emulator.replica import REPLICA
from emulator.responses_input import chat_messages
from emulator.responses_request import parse, plan
from emulator.responses_stream import EventWriter
from emulator.tickets import Emitted, Finished
from emulator.tokenizer_kind import make_tokenizer
from tests.conftest import wait_for
from tests.emulator.conftest import Emu, StartEmu

FAST = ("--emu-time-scale", "0.001")
MODEL = "kvroute-emu"
ASK = "tell me how a prefix cache keeps the earlier turns of a chat"
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
}
RESPONSE_KEYS = [
    "id", "object", "created_at", "model", "output", "status", "usage", "parallel_tool_calls", "tool_choice",
    "tools", "error", "incomplete_details", "instructions", "max_output_tokens", "previous_response_id",
    "reasoning", "store", "temperature", "text", "top_p", "truncation", "user", "metadata",
]  # fmt: skip


async def _post(emu: Emu, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with emu.http.post(emu.url + path, json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _post_empty(emu: Emu, path: str, body: dict[str, Any]) -> None:
    async with emu.http.post(emu.url + path, json=body) as resp:
        assert resp.status == 200


async def _get(emu: Emu, path: str) -> tuple[int, Any]:
    async with emu.http.get(emu.url + path) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _create(emu: Emu, **body: Any) -> dict[str, Any]:
    status, out = await _post(emu, "/v1/responses", {"model": MODEL, **body})
    assert status == 200, out
    result: dict[str, Any] = out
    return result


async def _events(emu: Emu, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The raw stream and its events; every frame's `event:` line names its data's type."""
    async with emu.http.post(
        f"{emu.url}/v1/responses", json={"model": MODEL, "stream": True, **body}
    ) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        raw = (await resp.read()).decode()
    events = []
    for block in raw.strip().split("\n\n"):
        head, data = block.split("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(event)
    return raw, events


def _error(
    status: int, body: Any, message: str, param: str | None, type_: str = "invalid_request_error"
) -> None:
    assert body == {"error": {"message": message, "type": type_, "param": param, "code": status}}


async def test_the_response_object(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    meta = {"team": "cache"}
    out = await _create(
        emu, input=ASK, instructions="Be brief.", max_output_tokens=8, metadata=meta, user="u1", temperature=1
    )
    assert list(out) == RESPONSE_KEYS
    assert (
        re.fullmatch(r"resp_[0-9a-f]{32}", out["id"])
        and out["object"] == "response"
        and out["model"] == MODEL
    )
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = out["output"]
    assert re.fullmatch(r"msg_[0-9a-f]{32}", message["id"])
    rest = {k: v for k, v in message.items() if k not in ("id", "content")}
    assert rest == {"role": "assistant", "status": "completed", "type": "message", "phase": "final_answer"}
    (part,) = message["content"]
    assert (
        part["type"] == "output_text"
        and part["annotations"] == []
        and part["logprobs"] is None
        and part["text"]
    )
    usage = out["usage"]
    assert usage["output_tokens"] == 6  # max_output_tokens - 2
    assert usage["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 0,
    }  # reported, even at 0
    assert (
        usage["total_tokens"] == usage["input_tokens"] + 6
        and usage["output_tokens_details"]["reasoning_tokens"] == 0
    )
    assert out["instructions"] == "Be brief." and out["metadata"] == meta and out["user"] == "u1"
    assert out["temperature"] == 1.0 and out["top_p"] is None and out["store"] is True
    assert out["text"] == {"format": {"type": "text"}} and out["truncation"] == "disabled"
    assert out["reasoning"] == {"effort": None, "summary": None} and out["tool_choice"] == "auto"
    again = await _create(
        emu, input=ASK, instructions="Be brief.", max_output_tokens=8, request_id="resp_mine"
    )
    assert again["id"] == "resp_mine" and again["metadata"] == {}
    assert again["usage"]["input_tokens_details"]["cached_tokens"] == usage["input_tokens"] - 1


async def test_input_items_render_as_the_chat_request(emulator: StartEmu) -> None:
    """Instructions → system; items → chat roles; the prompt is the chat prompt, its prefix cache shared."""
    emu = await emulator(*FAST)
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": '{"word":"kv"}',
    }
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": ASK}]},
        call,
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "a cache"}],
        },
        {"type": "message", "role": "user", "content": "thanks", "id": "x", "status": "completed"},
    ]
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"word":"kv"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cache"},
        {"role": "user", "content": "thanks"},
    ]
    status, done = await _post(emu, "/v1/chat/completions", {"model": "m", "messages": chat, "max_tokens": 3})
    assert status == 200
    out = await _create(emu, input=items, instructions="Be brief.", max_output_tokens=5)
    prompt = done["usage"]["prompt_tokens"]
    assert out["usage"]["input_tokens"] == prompt
    assert out["usage"]["input_tokens_details"]["cached_tokens"] == prompt - 1  # the chat request's prefix


async def test_a_second_turn_from_the_first_turns_output_items_hits_the_cache(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    first = await _create(emu, input=ASK, max_output_tokens=12)
    turn = [{"role": "user", "content": ASK}, *first["output"], {"role": "user", "content": "and then?"}]
    second = await _create(emu, input=turn, max_output_tokens=6)
    before = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == before  # prompt + answer, as chat


async def test_tool_calls_and_their_results(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    out = await _create(emu, input=ASK, tools=[TOOL])
    (call,) = out["output"]
    assert re.fullmatch(r"fc_[0-9a-f]{8}", call["id"]) and re.fullmatch(r"call_[0-9a-f]{24}", call["call_id"])
    assert call["type"] == "function_call" and call["name"] == "lookup" and call["status"] == "completed"
    assert isinstance(orjson.loads(call["arguments"])["word"], str)
    assert out["status"] == "completed" and out["text"] is None and out["tools"][0]["strict"] is False
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "a cache keeps prefixes"}
    after = await _create(emu, input=[{"role": "user", "content": ASK}, call, result], tools=[TOOL])
    assert [item["type"] for item in after["output"]] == ["message"]  # after a tool result: text
    assert after["usage"]["input_tokens_details"]["cached_tokens"] > 0
    named = await _create(emu, input=ASK, tools=[TOOL], tool_choice={"type": "function", "name": "lookup"})
    assert named["output"][0]["type"] == "function_call" and named["tool_choice"] == {
        "type": "function",
        "name": "lookup",
    }
    plain = await _create(emu, input=ASK, tools=[TOOL], tool_choice="none", max_output_tokens=4)
    assert plain["output"][0]["type"] == "message"


@pytest.mark.parametrize(
    ("body", "status", "message", "param"),
    [
        (
            {"input": [{"type": "item_reference", "id": "x"}]},
            400,
            "Unsupported Responses API input item type: 'item_reference' None",
            None,
        ),
        (
            {"input": "x", "tools": [{"type": "shell"}]},
            400,
            "Shell tools are not supported by this model",
            "tools",
        ),
        (
            {"input": "x", "tool_choice": "required"},
            400,
            'tool_choice="required" requires at least one tool with type="function" or type="custom"; '
            "other built-in tool types cannot be forced.",
            None,
        ),
        (
            {"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}},
            400,
            "Tool 'other' is not declared in tools",
            "tool_choice",
        ),
        (
            {"input": "x", "stream": True, "include": ["message.output_text.logprobs"]},
            400,
            "logprobs are not supported in streaming mode",
            "logprobs",
        ),
        ({"input": "x", "model": "gpt-x"}, 404, "The model 'gpt-x' does not exist", "model"),
        (
            {"input": "x", "background": True},
            400,
            "Response store is disabled. Stateful Responses require --enable-response-store on a standalone "
            "server; response storage is unavailable in PD mode.",
            "background",
        ),
        (
            {"input": "x", "temperature": -1},
            400,
            "temperature must be a non-negative finite number, got -1.0.",
            None,
        ),
        ({"input": "x", "max_output_tokens": 1}, 400, "max_new_tokens must be at least 0, got -1.", None),
        (
            {
                "input": "x",
                "tools": [TOOL],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}},
            },
            400,
            "Cannot combine tool calls with constrained decoding "
            "(text.format / regex / ebnf / structural_tag / json_schema). Remove one.",
            None,
        ),
    ],
)
async def test_request_errors(
    emulator: StartEmu, body: dict[str, Any], status: int, message: str, param: str | None
) -> None:
    emu = await emulator(*FAST)
    got, err = await _post(emu, "/v1/responses", {"model": MODEL, **body})
    assert got == status
    _error(status, err, message, param)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": MODEL}, "input"),
        ({"input": "x", "tools": [{"type": "browser"}]}, "tools.0.type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools.0"),
        ({"input": "x", "include": ["usage"]}, "include.0"),
        ({"input": "x", "truncation": "middle"}, "truncation"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "o"}}},
            "text.format.json_schema.schema",
        ),
    ],
)
async def test_validation_errors_are_bad_requests(
    emulator: StartEmu, body: dict[str, Any], field: str
) -> None:
    emu = await emulator(*FAST)
    status, err = await _post(emu, "/v1/responses", body)
    assert status == 400 and err["error"]["type"] == "Bad Request" and err["error"]["code"] == 400
    assert (
        err["error"]["param"] is None
        and f"validation error for ResponsesRequest\n{field}\n" in err["error"]["message"]
    )


async def test_no_model_content_types_and_other_routes(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    status, err = await _post(
        emu, "/v1/responses", {"input": "x"}
    )  # SGLang's internal chat request needs one
    assert status == 400 and err["error"]["message"].startswith(
        "1 validation error for ChatCompletionRequest\nmodel\n"
    )
    async with emu.http.post(
        f"{emu.url}/v1/responses", data=b'{"input": "x"}', headers={"Content-Type": "text/plain"}
    ) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["type"] == "Bad Request"
    async with emu.http.delete(f"{emu.url}/v1/responses/resp_1") as resp:
        assert resp.status == 405 and await resp.json() == {"detail": "Method Not Allowed"}
    for path in ("/v1/conversations", "/v1/responses/resp_1/input_items"):
        assert await _get(emu, path) == (404, {"detail": "Not Found"})
    ok = await _create(emu, input="x", conversation="conv_1", prompt_cache_key="k", max_output_tokens=3)
    assert ok["status"] == "incomplete"  # unknown fields are ignored


async def test_the_event_stream(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    raw, events = await _events(emu, {"input": ASK, "max_output_tokens": 10})
    assert "[DONE]" not in raw
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * deltas, "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    assert deltas == 8  # one engine step, one token, each
    created = events[0]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert final["id"] == created["id"] and final["output"][0]["content"][0]["text"] == text
    assert events[-2]["item"] == final["output"][0] and final["usage"]["output_tokens"] == 8
    _, tool_events = await _events(emu, {"input": ASK, "tools": [TOOL]})
    assert [e["type"] for e in tool_events][2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert tool_events[2]["item"]["arguments"] == "" and tool_events[2]["item"]["status"] == "in_progress"
    assert tool_events[4]["arguments"] == tool_events[-1]["response"]["output"][0]["arguments"]


async def test_a_stream_the_engine_refuses_ends_failed(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    _, events = await _events(emu, {"input": ASK, "temperature": -0.5})
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["output"] == [] and failed["usage"] is None
    assert failed["error"] == {
        "code": "server_error",
        "message": "temperature must be a non-negative finite number, got -0.5.",
    }


async def test_with_tools_the_message_events_are_held_until_the_end(emulator: StartEmu) -> None:
    """SGLang's buffering: from the message's output_item.added on, nothing leaves before the end."""
    emu = await emulator(*FAST)
    replica = emu.app[REPLICA]
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
    items = [
        {"role": "user", "content": ASK},
        call,
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
    ]
    body = {"model": MODEL, "input": items, "tools": [TOOL], "max_output_tokens": 6}  # a text answer
    parsed = parse(body, replica, replica.responses)
    planned = plan(parsed, replica)
    assert planned.call is None
    writer = EventWriter(parsed, planned, None, lambda _response: None)
    assert len(writer.start()) == 2
    assert all(writer.on_event(Emitted((k,))) == [] for k in range(1, 5))
    frames = writer.on_event(Finished())
    payloads = [orjson.loads(f.split(b"\ndata: ")[1]) for f in frames]
    assert (
        payloads[0]["type"] == "response.output_item.added" and payloads[-1]["type"] == "response.incomplete"
    )
    assert [p["sequence_number"] for p in payloads] == list(range(2, 2 + len(payloads)))
    assert payloads[0]["item"]["phase"] == "final_answer"


async def test_developer_reasoning_and_logprobs(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    blob = "sglang-reasoning-v1." + base64.urlsafe_b64encode(zlib.compress(b"thought")).decode()
    items = [
        {"role": "user", "content": ASK},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A tree."}]},
        {"role": "developer", "content": "Use short words."},
        {"role": "user", "content": "more"},
    ]
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "A tree."},
        {
            "role": "system",
            "content": "Developer instructions:\nUse short words.",
        },  # inline: ChatML renders it
        {"role": "user", "content": "more"},
    ]
    _, done = await _post(emu, "/v1/chat/completions", {"model": "m", "messages": chat, "max_tokens": 2})
    body = {"input": items, "instructions": "Be brief.", "max_output_tokens": 6}
    out = await _create(emu, **body, include=["message.output_text.logprobs"], top_logprobs=2)
    assert out["usage"]["input_tokens"] == done["usage"]["prompt_tokens"]
    logprobs = out["output"][0]["content"][0]["logprobs"]
    assert len(logprobs) == 4 and set(logprobs[0]) == {"token", "bytes", "logprob", "top_logprobs"}
    assert len(logprobs[0]["top_logprobs"]) == 2
    assert "".join(lp["token"] for lp in logprobs) == out["output"][0]["content"][0]["text"]


def test_system_texts_join_when_the_template_drops_later_ones(tmp_path: Path) -> None:
    """SGLang's probe: a template that ignores a system message after the first gets one leading block."""
    shutil.copy(MODEL_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    template = (
        "{% for m in messages %}{% if m.role != 'system' or loop.first %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tokenizer = make_tokenizer("hf", str(tmp_path))
    items = [{"role": "user", "content": "hi"}, {"role": "developer", "content": "short"}]
    assert chat_messages(items, "Be brief.", tokenizer) == [
        {"role": "system", "content": "Be brief.\n\nDeveloper instructions:\nshort"},
        {"role": "user", "content": "hi"},
    ]
    pseudo = make_tokenizer("pseudo", str(MODEL_DIR))
    assert [m["role"] for m in chat_messages(items, "Be brief.", pseudo)] == ["system", "user", "system"]


async def test_an_aborted_generation_is_a_failed_response(emulator: StartEmu) -> None:
    """/abort_request ends the run as SGLang's abort finish reason does: status failed, server_error."""
    emu = await emulator("--emu-time-scale", "0.05", "--emu-debug")
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 402, "request_id": "resp_abort"}
    task = asyncio.create_task(_post(emu, "/v1/responses", body))

    async def decoding() -> bool:
        return bool((await emu.state())["queue"]["running"])

    await wait_for(decoding)
    await _post_empty(emu, "/abort_request", {"rid": "resp_abort"})
    status, out = await task
    assert status == 200 and out["status"] == "failed" and out["id"] == "resp_abort"
    assert out["error"] == {"code": "server_error", "message": "Abort request by user."}
    assert out["incomplete_details"] is None and out["usage"]["output_tokens"] < 400


async def test_faults_apply_to_responses(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, "--emu-enable-faults")
    await emu.fault(action="fail", status=503)
    status, err = await _post(emu, "/v1/responses", {"model": MODEL, "input": ASK})
    _error(503, err, "Emulated fault.", None, "Service Unavailable")
    assert status == 503
