"""/v1/responses input items → chat messages, as SGLang 0.5.23 renders them (responses-contract §1.3).

SGLang (`serving_responses.py` `_construct_input_messages`, `_normalize_response_message_for_chat`,
`_merge_consecutive_assistant_messages`, `responses_adapters.label_developer_content`):

- the history is the stored chain (`previous_response_id`) + this request's input; a string input is one
  `{"role": "user", "content": s}`; `instructions` become a leading system message (never inherited);
- a `message` item (or one without `type`) loses `id`, `status` and `type` and its None values;
  `input_text` / `output_text` parts become `text` parts, `input_image` an `image_url` part (detail
  "auto"); the `developer` role becomes a system message whose text starts "Developer instructions:";
- `function_call` → an assistant message with one `tool_calls` entry (id = `call_id`, else `id`), its
  `arguments` coerced to a JSON-object string (`"{}"` when it is not one); `function_call_output` /
  `custom_tool_call_output` → a `tool` message (list output flattened to its text);
- `reasoning` → an assistant `reasoning_content` from `summary`, else `content` texts, else the decoded
  `encrypted_content` (`"sglang-reasoning-v1."` + base64url(zlib(text)), not encrypted); dropped if empty;
- any other type is a ValueError: "Unsupported Responses API input item type: 'x'";
- consecutive assistant messages of the same phase merge (content joined by a blank line, tool calls and
  reasoning concatenated);
- when the chat template does not render a system message after the first turn (SGLang probes it with a
  sentinel), every system text is joined into one leading system message.
"""

from __future__ import annotations

import base64
import binascii
import functools
import zlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, cast

import jinja2
import orjson

from emulator.hf_tokenizer import HfTokenizer
from emulator.tokenizer import PseudoTokenizer, chat_text
from emulator.tokenizer_kind import Tokenizer

DEVELOPER_LABEL = "Developer instructions:"
REASONING_PREFIX = "sglang-reasoning-v1."
_SENTINEL = "__sglang_inline_system_sentinel__"
_DROPPED = ("id", "status", "type")


class InputItemError(ValueError):
    """An input item SGLang's normalizer refuses (a 400 on /v1/responses)."""


def history(previous: Sequence[Any], input_: str | list[Any]) -> list[Any]:
    """The stored chain's items, then this request's input (a string as one user message)."""
    items = list(previous)
    if isinstance(input_, str):
        items.append({"role": "user", "content": input_})
    else:
        items.extend(input_)
    return items


def chat_messages(
    items: Sequence[Any], instructions: str | None, tokenizer: Tokenizer
) -> list[dict[str, Any]]:
    """The chat messages of a Responses history (module docstring); raises InputItemError."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        message = _message(item)
        if message is not None:
            messages.append(message)
    messages = _merged(messages)
    if inline_system(tokenizer):
        return messages
    return _one_system(messages)


def inline_system(tokenizer: Tokenizer) -> bool:
    """SGLang's `detect_inline_system_support`: a second system message renders where it stands."""
    return _probe(cast(Hashable, tokenizer))


@functools.lru_cache(maxsize=16)  # one probe per tokenizer (per replica, or per directory for hf)
def _probe(key: Hashable) -> bool:
    """SGLang renders the template's text (`add_generation_prompt=False`) and looks for the sentinel."""
    probe = [
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
        {"role": "system", "content": _SENTINEL},
        {"role": "user", "content": "t"},
    ]
    if isinstance(key, PseudoTokenizer):
        return _SENTINEL in chat_text(probe, None, {})
    template = key.template if isinstance(key, HfTokenizer) else None
    if template is None:
        return False
    try:
        return _SENTINEL in template.render(probe, None, add_generation_prompt=False)
    except jinja2.TemplateError:  # a template that raises on it: merge into the leading block
        return False


def _message(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, Mapping):
        raise InputItemError(f"Unsupported Responses API input item type: {type(item).__name__!r}")
    msg = dict(item)
    if msg.get("role") == "developer":
        msg = {**msg, "role": "system", "content": _labelled(msg.get("content"))}
    kind = msg.get("type")
    if kind == "function_call":
        return _call(msg, msg.get("name"), _arguments(msg.get("arguments")))
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "tool_call_id": msg.get("call_id"), "content": _flat(msg.get("output", ""))}
    if kind == "reasoning":
        return _reasoning(msg)
    if kind not in (None, "message"):
        raise InputItemError(f"Unsupported Responses API input item type: {kind!r}")
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
                return [
                    *content[:i],
                    {**part, "text": f"{DEVELOPER_LABEL}\n{part['text']}"},
                    *content[i + 1 :],
                ]
        return [{"type": "input_text", "text": DEVELOPER_LABEL}, *content]
    return content


def _arguments(raw: Any) -> str:
    """A JSON-object string, as SGLang coerces a replayed call's arguments."""
    if isinstance(raw, dict):
        return orjson.dumps(raw).decode()
    if not isinstance(raw, str) or not raw:
        return "{}"
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "{}"
    return raw if isinstance(parsed, dict) else "{}"


def _call(msg: Mapping[str, Any], name: Any, arguments: str) -> dict[str, Any]:
    call = {"id": msg.get("call_id") or msg.get("id"), "type": "function"}
    return {"role": "assistant", "tool_calls": [call | {"function": {"name": name, "arguments": arguments}}]}


def _flat(output: Any) -> Any:
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return output


def _reasoning(msg: Mapping[str, Any]) -> dict[str, Any] | None:
    def texts(parts: Any) -> list[str]:
        return [str(p["text"]) for p in parts or [] if isinstance(p, dict) and p.get("text")]

    found = texts(msg.get("summary")) or texts(msg.get("content")) or _decoded(msg.get("encrypted_content"))
    return {"role": "assistant", "reasoning_content": "\n".join(found)} if found else None


def _decoded(blob: Any) -> list[str]:
    """The trace in SGLang's encoded `encrypted_content` blob ([] when it is not one)."""
    if not isinstance(blob, str) or not blob.startswith(REASONING_PREFIX):
        return []
    try:
        text = zlib.decompress(base64.urlsafe_b64decode(blob[len(REASONING_PREFIX) :])).decode()
    except (ValueError, binascii.Error, zlib.error):
        return []
    return [text] if text else []


def _part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        url = part.get("image_url")
        image = dict(url) if isinstance(url, dict) else {"url": url}
        image["detail"] = image.get("detail") or part.get("detail") or "auto"
        return {"type": "image_url", "image_url": image}
    return part


def _merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        prev = out[-1] if out else None
        if prev is not None and msg.get("role") == "assistant" == prev.get("role") and _joins(prev, msg):
            out[-1] = _join(prev, msg)
        else:
            out.append(msg)
    return out


def _joins(prev: Mapping[str, Any], msg: Mapping[str, Any]) -> bool:
    return prev.get("phase") == msg.get("phase") or set(prev) == {"role", "reasoning_content"}


def _join(prev: dict[str, Any], msg: Mapping[str, Any]) -> dict[str, Any]:
    joined = dict(prev)
    if msg.get("phase") is not None:
        joined["phase"] = msg["phase"]
    new = msg.get("content")
    if new is not None and new != "":
        old = joined.get("content")
        if old is None or old == "":
            joined["content"] = new
        elif isinstance(old, str) and isinstance(new, str):
            joined["content"] = f"{old}\n\n{new}"
        else:
            joined["content"] = _parts_of(old) + _parts_of(new)
    if msg.get("tool_calls"):
        joined["tool_calls"] = list(joined.get("tool_calls") or []) + list(msg["tool_calls"])
    if msg.get("reasoning_content"):
        old_r = joined.get("reasoning_content")
        joined["reasoning_content"] = (
            f"{old_r}\n{msg['reasoning_content']}" if old_r else msg["reasoning_content"]
        )
    return joined


def _parts_of(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _one_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chunks: list[str] = []
    others: list[dict[str, Any]] = []
    for msg in messages:
        if msg.get("role") != "system":
            others.append(msg)
            continue
        content = msg.get("content")
        if isinstance(content, str):
            chunks.append(content)
        elif isinstance(content, list):
            chunks += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return [{"role": "system", "content": "\n\n".join(chunks)}, *others] if chunks else others
