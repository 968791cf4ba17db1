"""The fields of a /v1/responses body as SGLang 0.5.23's pydantic `ResponsesRequest` validates them
(responses-contract §1.2; `protocol.py` ResponsesRequest, ResponseTool, ResponseReasoningParam).

A field of the wrong type or outside its literals is FastAPI's validation error: 400, type "Bad Request",
param null (the message is pydantic's, as the emulator words every validation error: errors.invalid).
Unknown fields are ignored (`extra="ignore"`): conversation, prompt, prompt_cache_key, safety_identifier,
stream_options, context_management, ...

`input` is a string or a list of item objects; `tools` a list whose `type` is one of 13 literals, a
`function` tool needing a `name`; `include` values from 6 literals; `tool_choice` "auto" | "required" |
"none" or an object; `reasoning` `{effort, summary}` from their tiers; `text.format` text, json_object or
json_schema (`name` and `schema` required); `truncation` "auto" | "disabled"; `service_tier` one of five.
`tool_dump` is a tool as SGLang echoes it (`ResponseTool.model_dump()`: its declared fields, then extras).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from emulator.errors import ApiError, invalid

MODEL = "ResponsesRequest"
TOOL_TYPES = (
    "function",
    "web_search",
    "web_search_preview",
    "code_interpreter",
    "file_search",
    "image_generation",
    "computer_use_preview",
    "local_shell",
    "shell",
    "mcp",
    "custom",
    "namespace",
    "tool_search",
)
INCLUDES = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
_TOOL_DEFAULTS: dict[str, Any] = {
    "name": None,
    "description": None,
    "parameters": None,
    "strict": False,
    "tools": None,
    "defer_loading": None,
    "format": None,
}
Check = Callable[[Any], str | None]


def _is(*kinds: type) -> Check:
    names = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dict: "dictionary",
        list: "list",
    }
    detail = f"Input should be a valid {names[kinds[0]]}"

    def check(value: Any) -> str | None:
        if isinstance(value, bool) and bool not in kinds:
            return detail
        return None if isinstance(value, kinds) else detail

    return check


def _literal(*allowed: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in allowed else "Input should be " + " or ".join(repr(a) for a in allowed)

    return check


_FIELDS: dict[str, Check] = {
    "instructions": _is(str),
    "model": _is(str),
    "previous_response_id": _is(str),
    "user": _is(str),
    "request_id": _is(str),
    "session_id": _is(str),
    "cache_salt": _is(str),
    "extra_key": _is(str),
    "max_output_tokens": _is(int),
    "max_tool_calls": _is(int),
    "top_logprobs": _is(int),
    "top_k": _is(int),
    "priority": _is(int),
    "temperature": _is(float, int),
    "top_p": _is(float, int),
    "min_p": _is(float, int),
    "repetition_penalty": _is(float, int),
    "frequency_penalty": _is(float, int),
    "presence_penalty": _is(float, int),
    "background": _is(bool),
    "store": _is(bool),
    "stream": _is(bool),
    "parallel_tool_calls": _is(bool),
    "metadata": _is(dict),
    "chat_template_kwargs": _is(dict),
    "truncation": _literal("auto", "disabled"),
}


def validate(body: dict[str, Any]) -> None:
    """Raise the validation 400 of the first field pydantic would reject."""
    _input(body)
    for key, check in _FIELDS.items():
        value = body.get(key)
        if value is not None and (detail := check(value)) is not None:
            raise _bad(key, detail)
    if body.get("service_tier", "auto") not in ("auto", "default", "flex", "scale", "priority"):
        raise _bad("service_tier", "Input should be 'auto', 'default', 'flex', 'scale' or 'priority'")
    _stop(body.get("stop"))
    _include(body.get("include"))
    _tools(body.get("tools", []))
    _tool_choice(body.get("tool_choice", "auto"))
    _reasoning(body.get("reasoning"))
    _text(body.get("text"))


def tool_dump(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as SGLang echoes it: type, the declared fields with their defaults, then the extras."""
    declared = {key: tool.get(key, default) for key, default in _TOOL_DEFAULTS.items()}
    return {"type": tool["type"], **declared, **{k: v for k, v in tool.items() if k not in declared}}


def _bad(field: str, detail: str) -> ApiError:
    return invalid(field, MODEL, detail)


def _input(body: dict[str, Any]) -> None:
    if "input" not in body:
        raise _bad("input", "Field required [type=missing]")
    value = body["input"]
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
        return
    raise _bad("input", "Input should be a valid string or a list of input items")


def _stop(value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        raise _bad("stop", "Input should be a valid string or list of strings")


def _include(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise _bad("include", "Input should be a valid list")
    for i, item in enumerate(value):
        if item not in INCLUDES:
            raise _bad(f"include.{i}", "Input should be " + ", ".join(repr(v) for v in INCLUDES))


def _tools(value: Any) -> None:
    if not isinstance(value, list):
        raise _bad("tools", "Input should be a valid list")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise _bad(f"tools.{i}", "Input should be a valid dictionary or instance of ResponseTool")
        if tool.get("type") not in TOOL_TYPES:
            raise _bad(f"tools.{i}.type", "Input should be " + ", ".join(repr(t) for t in TOOL_TYPES))
        if tool["type"] == "function" and not tool.get("name"):
            raise _bad(f"tools.{i}", "Value error, Function tools must include a name. [type=value_error]")


def _tool_choice(value: Any) -> None:
    if value not in ("auto", "required", "none") and not isinstance(value, dict):
        raise _bad("tool_choice", "Input should be 'auto', 'required' or 'none', or a valid dictionary")


def _reasoning(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad("reasoning", "Input should be a valid dictionary or instance of ResponseReasoningParam")
    if value.get("effort") is not None and value["effort"] not in EFFORTS:
        raise _bad("reasoning.effort", "Input should be " + ", ".join(repr(e) for e in EFFORTS))
    if value.get("summary") not in (None, "auto", "concise", "detailed"):
        raise _bad("reasoning.summary", "Input should be 'auto', 'concise' or 'detailed'")


def _text(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad("text", "Input should be a valid dictionary or instance of ResponseTextConfig")
    fmt = value.get("format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise _bad("text.format", "Input tag should be 'text', 'json_schema' or 'json_object'")
    if kind == "json_schema":
        for key, check in (("name", _is(str)), ("schema", _is(dict))):
            if key not in fmt:
                raise _bad(f"text.format.json_schema.{key}", "Field required [type=missing]")
            if (detail := check(fmt[key])) is not None:
                raise _bad(f"text.format.json_schema.{key}", detail)
