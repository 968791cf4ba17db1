"""A Responses request seen as the chat request SGLang turns it into: what routing hashes (pure).

SGLang 0.5.23 renders ``/v1/responses`` through its chat path (responses-contract §1.3): ``instructions``
become a leading system message; a string input is one user message; a ``message`` item (or one without
``type``) loses ``id``, ``status`` and ``type``, its ``input_text`` / ``output_text`` parts become ``text``
parts and the ``developer`` role a system message whose text starts "Developer instructions:"; a
``function_call`` becomes an assistant ``tool_calls`` entry (id = ``call_id``, else ``id``; the arguments
a JSON-object string, ``"{}"`` when they are not one); ``function_call_output`` and
``custom_tool_call_output`` a ``tool`` message; ``reasoning`` an assistant message carrying only
reasoning; consecutive assistant messages of one phase merge. Item types SGLang refuses are skipped
here: the replica answers them with its own 400. Function tools (and custom ones, as a one-string
function) become chat tools; ``reasoning.effort`` and ``chat_template_kwargs`` are template options.

So a chain's turns render (``routing.canonical``) as the equivalent chat conversation does, and each
turn's rendering starts with the one before: they hash onto the replica that holds their prefix.
``chat_body`` is the same view as a chat body, for exact mode's chat template (``Gateway.exact``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.types import JSONObject
from routing.prompt import ChatPrompt, Message

DEVELOPER_LABEL = "Developer instructions:"
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_DROPPED = ("id", "status", "type")


def chat_messages(items: Sequence[Any], instructions: object) -> list[JSONObject]:
    """The chat messages of a Responses history (the chain's items, then this request's input)."""
    out: list[JSONObject] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        message = _message(item) if isinstance(item, Mapping) else None
        if message is not None:
            out.append(message)
    return _merged(out)


def chat_tools(tools: object) -> list[JSONObject] | None:
    """The function tools chat sees: ``function`` tools, and ``custom`` ones as a one-string function."""
    out: list[JSONObject] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "function":
            params = tool.get("parameters")
        elif tool.get("type") == "custom":
            params = CUSTOM_PARAMETERS
        else:
            continue
        fn = {"name": tool["name"], "description": tool.get("description"), "parameters": params}
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out or None


def template_options(body: JSONObject) -> tuple[tuple[str, Any], ...]:
    """The prefix-relevant template options, sorted by name (``routing.canonical.TEMPLATE_OPTIONS``)."""
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    options = {"chat_template_kwargs": body.get("chat_template_kwargs"), "reasoning_effort": effort}
    return tuple(sorted((k, v) for k, v in options.items() if v is not None))


def chat_prompt(items: Sequence[Any], body: JSONObject) -> ChatPrompt:
    messages = chat_messages(items, body.get("instructions"))
    return ChatPrompt(
        tuple(_routing(m) for m in messages), chat_tools(body.get("tools")), template_options(body)
    )


def chat_body(items: Sequence[Any], body: JSONObject) -> JSONObject:
    """The same view as a chat request body (messages, tools, template options)."""
    out: JSONObject = {"messages": chat_messages(items, body.get("instructions"))}
    tools = chat_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    return out | dict(template_options(body))


def _routing(m: JSONObject) -> Message:
    name = m.get("name")
    call_id = m.get("tool_call_id")
    return Message(
        str(m.get("role", "user")),
        m.get("content"),
        name if isinstance(name, str) and name else None,
        m.get("tool_calls"),
        call_id if isinstance(call_id, str) and call_id else None,
    )


def _message(item: Mapping[str, Any]) -> JSONObject | None:
    msg = dict(item)
    if msg.get("role") == "developer":
        msg = {**msg, "role": "system", "content": _labelled(msg.get("content"))}
    kind = msg.get("type")
    if kind == "function_call":
        call = {"id": msg.get("call_id") or msg.get("id"), "type": "function"}
        fn = {"name": msg.get("name"), "arguments": _arguments(msg.get("arguments"))}
        return {"role": "assistant", "tool_calls": [call | {"function": fn}]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "tool_call_id": msg.get("call_id"), "content": _flat(msg.get("output", ""))}
    if kind == "reasoning":
        return {"role": "assistant", "reasoning_content": True}
    if kind not in (None, "message"):
        return None
    content = msg.get("content")
    if isinstance(content, list):
        msg["content"] = [_part(p) for p in content]
    return {k: v for k, v in msg.items() if v is not None and k not in _DROPPED}


def _labelled(content: Any) -> Any:
    if isinstance(content, str):
        return f"{DEVELOPER_LABEL}\n{content}"
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                labelled = {**part, "text": f"{DEVELOPER_LABEL}\n{part['text']}"}
                return [*content[:i], labelled, *content[i + 1 :]]
        return [{"type": "input_text", "text": DEVELOPER_LABEL}, *content]
    return content


def _arguments(raw: Any) -> str:
    if isinstance(raw, dict):
        return orjson.dumps(raw).decode()
    if not isinstance(raw, str) or not raw:
        return "{}"
    try:
        return raw if isinstance(orjson.loads(raw), dict) else "{}"
    except orjson.JSONDecodeError:
        return "{}"


def _flat(output: Any) -> Any:
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return output


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    return part


def _merged(messages: list[JSONObject]) -> list[JSONObject]:
    """Consecutive assistant messages of one phase merge (one holding only reasoning merges forward)."""
    out: list[JSONObject] = []
    for msg in messages:
        prev = out[-1] if out else None
        if prev is not None and msg.get("role") == "assistant" == prev.get("role") and _joins(prev, msg):
            out[-1] = _join(prev, msg)
        else:
            out.append(msg)
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in out]


def _joins(prev: JSONObject, msg: JSONObject) -> bool:
    return prev.get("phase") == msg.get("phase") or set(prev) == {"role", "reasoning_content"}


def _join(prev: JSONObject, msg: JSONObject) -> JSONObject:
    joined = {**prev, **{k: v for k, v in msg.items() if k in ("phase", "reasoning_content")}}
    new, old = msg.get("content"), prev.get("content")
    if new not in (None, ""):
        if old in (None, ""):
            joined["content"] = new
        elif isinstance(old, str) and isinstance(new, str):
            joined["content"] = f"{old}\n\n{new}"
        else:
            joined["content"] = _parts_of(old) + _parts_of(new)
    if msg.get("tool_calls"):
        joined["tool_calls"] = list(prev.get("tool_calls") or []) + list(msg["tool_calls"])
    return joined


def _parts_of(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []
