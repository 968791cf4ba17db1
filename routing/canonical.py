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
and keeps every earlier block hash (``routing.hashing``).

Text prompts render as themselves; token-id prompts as their ids (``<ids>1,2,3,``). The input is the
typed ``routing.prompt.Prompt`` the proxy parsed once (a batch is represented by its first prompt), never
a request body: the rendering depends only on parsed values, not on the JSON key order or whitespace of
the body. The text exists only in memory on the request path; it is hashed, never logged or stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash

from routing.prompt import ChatPrompt, Message, Namespace, Prompt, TextPrompt, TokenPrompt

TEMPLATE_OPTIONS = (
    "add_generation_prompt",
    "chat_template_kwargs",
    "continue_final_message",
    "reasoning_effort",
)
"""Body fields of a chat request that change the rendered prompt without being messages or tools."""

_MSG_START = "\x1e"  # record separator opens a message
_MSG_END = "\x1f\n"  # unit separator + newline closes it


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: equal values give equal strings whatever their key order."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):  # e.g. integers beyond 64 bits
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def render(prompt: Prompt | None) -> str:
    """The canonical rendering of a prompt (see the module docstring); "" for no prompt."""
    if isinstance(prompt, ChatPrompt):
        return _chat(prompt)
    if isinstance(prompt, TextPrompt):
        return prompt.text
    if isinstance(prompt, TokenPrompt):
        return "<ids>" + ",".join(map(str, prompt.ids)) + "," if prompt.ids else ""
    return ""


def namespace_salt(ns: Namespace) -> str:
    """The cache namespace of a request: SGLang's ``extra_key_effective`` (``cache_salt + extra_key``,
    contract §8), the LoRA adapter (its own cache namespace), and the gateway tenant when there is one."""
    parts = [ns.cache_salt + ns.extra_key]
    if ns.lora:
        parts.append("lora=" + ns.lora)
    if ns.tenant:
        parts.append("tenant=" + ns.tenant)
    return "\x00".join(parts) if len(parts) > 1 else parts[0]


def _chat(prompt: ChatPrompt) -> str:
    out: list[str] = []
    if prompt.options:
        out.append("<header>" + canonical_json(dict(prompt.options)) + _MSG_END)
    if prompt.tools:
        out.append("<tools>" + canonical_json(prompt.tools) + _MSG_END)
    out.extend(_message(m) for m in prompt.messages)
    return "".join(out)


def _message(msg: Message) -> str:
    out = [_MSG_START, msg.role or "user"]
    if msg.name:
        out.append(" name=" + msg.name)
    out.append("\n")
    out.append(_content(msg.content))
    if msg.tool_calls:
        out.append("<tool_calls>" + canonical_json(msg.tool_calls))
    if msg.tool_call_id:
        out.append("<tool_call_id>" + msg.tool_call_id)
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
    kind = part.get("type")
    kind = kind if isinstance(kind, str) and kind else "text"
    if kind == "text":
        text = part.get("text")
        return text if isinstance(text, str) else ""
    payload = canonical_json({k: v for k, v in part.items() if k != "type"})
    return f"<{kind}:{xxhash.xxh3_64_hexdigest(payload.encode())}>"
