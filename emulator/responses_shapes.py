"""The JSON shapes of /v1/responses as SGLang 0.5.23 serializes them (responses-contract §1.4; `protocol.py`
ResponsesResponse.from_request and its usage serializer, `serving_responses.py` `_output_items`; item
models of openai 2.8.0, the version SGLang pins, dumped with their None fields).

- The response: `id` (= `request_id`), `object: "response"`, `created_at`, `model` (as sent), `output`,
  `status`, `usage`, then the echoes: `parallel_tool_calls`, `tool_choice` (effective), `tools`,
  `error`, `incomplete_details` (`{"reason": "max_output_tokens"}` when incomplete), `instructions`,
  `max_output_tokens`, `previous_response_id`, `reasoning` (`{effort, summary: null}`; effort only
  minimal/low/medium/high), `store`, `temperature`, `text` (as sent without nulls; else
  `{"format": {"type": "text"}}` when the output is text only), `top_p`, `truncation`, `user`,
  `metadata` (`{}` when absent).
- Output items: a `message` `msg_<32 hex>` with one `output_text` part (`annotations: []`, `logprobs`),
  `phase` "final_answer" ("commentary" when tool calls follow); a `function_call` `fc_<8 hex>` with
  `call_id` `call_<24 hex>` and string `arguments` (a `custom_tool_call` `ctc_<8 hex>` with `input` for a
  custom tool).
- Usage: `input_tokens`, `input_tokens_details {cached_tokens, cache_write_tokens: 0}`, `output_tokens`,
  `output_tokens_details {reasoning_tokens}`, `total_tokens`; cached_tokens is always reported (the
  handler is built with enable_prompt_tokens_details=True, whatever --enable-cache-report says).
- Status from the finish reason: length → incomplete; an abort or error → failed with
  `error: {"code": "server_error", "message"}`; otherwise completed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from emulator.response_store import without_none
from emulator.responses_request import ResponsesCall

ECHOABLE_EFFORTS = ("minimal", "low", "medium", "high")


def hex_id(prefix: str, length: int = 32) -> str:
    return f"{prefix}{uuid.uuid4().hex[:length]}"


def status_of(finish: str) -> str:
    return "incomplete" if finish == "length" else "completed"


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def server_error(message: str) -> dict[str, Any]:
    return {"code": "server_error", "message": message}


def output_text(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(
    item_id: str, content: list[dict[str, Any]], status: str = "completed", phase: str = "final_answer"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": phase,
    }


@dataclass(slots=True)
class CallItem:
    """One tool call's output item: a function_call, or a custom_tool_call for a custom tool."""

    name: str
    arguments: str
    custom: bool
    item_id: str = ""
    call_id: str = ""

    def __post_init__(self) -> None:
        self.item_id = self.item_id or hex_id("ctc_" if self.custom else "fc_", 8)
        self.call_id = self.call_id or hex_id("call_", 24)

    @classmethod
    def of(cls, call: ResponsesCall, tool_call: dict[str, Any]) -> CallItem:
        fn = tool_call["function"]
        custom = any(t["type"] == "custom" and t["name"] == fn["name"] for t in call.tools)
        return cls(str(fn["name"]), str(fn["arguments"]), custom)

    @property
    def payload(self) -> str:
        """A custom tool's freeform input: the shim function's `input` argument."""
        try:
            value = json.loads(self.arguments).get("input", "")
        except (ValueError, AttributeError):
            return ""
        return value if isinstance(value, str) else json.dumps(value)

    def item(self, done: bool = True) -> dict[str, Any]:
        if self.custom:
            return {
                "call_id": self.call_id,
                "input": self.payload if done else "",
                "name": self.name,
                "type": "custom_tool_call",
                "id": self.item_id,
            }
        return {
            "arguments": self.arguments if done else "",
            "call_id": self.call_id,
            "name": self.name,
            "type": "function_call",
            "id": self.item_id,
            "status": "completed" if done else "in_progress",
        }


def text_echo(call: ResponsesCall, output: list[dict[str, Any]]) -> dict[str, Any] | None:
    text = call.body.get("text")
    if text is not None:
        echoed: dict[str, Any] = without_none(text)
        return echoed
    text_only = bool(output) and all(item["type"] == "message" for item in output)
    return {"format": {"type": "text"}} if text_only else None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def response_body(
    call: ResponsesCall,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = call.body
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort", "medium") if isinstance(reasoning, dict) else None
    return {
        "id": call.request_id,
        "object": "response",
        "created_at": call.created_at,
        "model": body.get("model"),
        "output": output,
        "status": status,
        "usage": usage_,
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "tool_choice": call.tool_choice,
        "tools": list(call.tools),
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": effort if effort in ECHOABLE_EFFORTS else None, "summary": None},
        "store": body.get("store", True),
        "temperature": _float(body.get("temperature")),
        "text": text_echo(call, output),
        "top_p": _float(body.get("top_p")),
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
