"""Canonical prompt rendering: the text whose prefix decides the engine's KV-cache prefix.

The gateway never tokenizes. Instead it renders, deterministically, everything that the engine's chat
template turns into prompt tokens, in the order the template emits them:

1. a **header** with the other prefix-relevant fields (``chat_template_kwargs``, ``continue_final_message``,
   ``add_generation_prompt``, ``reasoning_effort``) when any is set: they change how the template renders,
   so two requests that differ in them must not share blocks;
2. the **tools**, as canonical JSON (sorted keys, compact separators): chat templates render tool schemas
   into the system turn, i.e. before every message;
3. the **messages** in order: role, optional name, content (a string, or a list of parts: text parts
   verbatim, other parts as a placeholder with a hash of their payload), assistant ``tool_calls`` (canonical
   JSON) and ``tool_call_id``.

Each message is closed by a record separator and nothing follows the last one (no generation prompt),
so a conversation that grows by one turn renders to a string that *starts with* the previous rendering
and keeps every earlier block hash (``routing.hashing``). The rendering depends only on parsed values,
never on the JSON key order or whitespace of the body.

``/v1/completions``: ``prompt`` as a string; for a list of prompts (a batch) the **first** prompt is used,
because the batch's requests share one replica and the first prompt's prefix is the one we can predict;
token-id prompts render as their ids (``<ids>1,2,3``). ``/generate``: ``text`` or ``input_ids`` the same
way. The text exists only in memory on the request path; it is hashed, never logged or stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash

HEADER_FIELDS = (
    "add_generation_prompt",
    "chat_template_kwargs",
    "continue_final_message",
    "reasoning_effort",
)
"""Body fields of a chat request that change the rendered prompt without being messages or tools."""

_MSG_START = "\x1e"  # record separator opens a message
_MSG_END = "\x1f\n"  # unit separator + newline closes it
_CHAT_PATHS = ("/v1/chat/completions",)
_TEXT_PATHS = ("/v1/completions",)


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: equal values give equal strings whatever their key order."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):  # e.g. integers beyond 64 bits
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical_prompt(path: str, body: Mapping[str, Any]) -> str:
    """The canonical rendering of a request body for ``path`` (see the module docstring)."""
    if path.endswith(_CHAT_PATHS):
        return _chat(body)
    if path.endswith(_TEXT_PATHS):
        return _prompt_value(body.get("prompt"))
    if path.endswith("/generate"):
        text = body.get("text")
        return _prompt_value(text if text is not None else body.get("input_ids"))
    return ""


def tenant_salt(body: Mapping[str, Any], tenant: str | None) -> str:
    """The cache namespace of a request: SGLang's ``extra_key_effective`` (``cache_salt + extra_key``,
    contract §8), the LoRA adapter (its own cache namespace), and the gateway tenant when there is one."""
    parts = [_str(body.get("cache_salt")) + _str(body.get("extra_key"))]
    lora = body.get("lora_path")
    if isinstance(lora, str) and lora:
        parts.append("lora=" + lora)
    if tenant:
        parts.append("tenant=" + tenant)
    return "\x00".join(parts) if len(parts) > 1 else parts[0]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _chat(body: Mapping[str, Any]) -> str:
    out: list[str] = []
    header = {k: body[k] for k in HEADER_FIELDS if body.get(k) is not None}
    if header:
        out.append("<header>" + canonical_json(header) + _MSG_END)
    tools = body.get("tools")
    if tools:
        out.append("<tools>" + canonical_json(tools) + _MSG_END)
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        out.extend(_message(m) for m in messages if isinstance(m, Mapping))
    return "".join(out)


def _message(msg: Mapping[str, Any]) -> str:
    out = [_MSG_START, _str(msg.get("role")) or "user"]
    name = msg.get("name")
    if isinstance(name, str) and name:
        out.append(" name=" + name)
    out.append("\n")
    out.append(_content(msg.get("content")))
    tool_calls = msg.get("tool_calls")
    if tool_calls:
        out.append("<tool_calls>" + canonical_json(tool_calls))
    call_id = msg.get("tool_call_id")
    if isinstance(call_id, str) and call_id:
        out.append("<tool_call_id>" + call_id)
    out.append(_MSG_END)
    return "".join(out)


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(_part(p) for p in content)
    return canonical_json(content)


def _part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        return canonical_json(part)
    kind = _str(part.get("type")) or "text"
    if kind == "text":
        return _str(part.get("text"))
    payload = canonical_json({k: v for k, v in part.items() if k != "type"})
    return f"<{kind}:{xxhash.xxh3_64_hexdigest(payload.encode())}>"


def _prompt_value(prompt: Any) -> str:
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt:
        first = prompt[0]
        if isinstance(first, int) and not isinstance(first, bool):
            return "<ids>" + ",".join(str(t) for t in prompt) + ","
        return _prompt_value(first)
    return ""
