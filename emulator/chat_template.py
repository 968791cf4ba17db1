"""A tokenizer directory's jinja2 chat template, applied to a chat request the way SGLang 0.5.10 does.

Rendering is HF transformers' ``apply_chat_template``: an ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with the ``loopcontrols`` extension, a ``tojson`` filter (``json.dumps``,
``ensure_ascii=False``), the globals ``raise_exception`` (a ``TemplateError``) and ``strftime_now``, and
the variables ``messages``, ``tools``, ``add_generation_prompt`` plus the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...) and the request's ``chat_template_kwargs``.

SGLang's side (``serving_chat._apply_jinja_template``, ``jinja_template_utils``):

- the template's content format is ``openai`` when it loops over ``message.content`` /
  ``message['content']``, else ``string``;
- each message's ``content: null`` becomes ``""`` and None-valued keys are dropped; list content is
  flattened for a ``string`` template (the ``text`` parts joined by one space, media parts dropped: a
  text-only model sees no image) and kept as parts for an ``openai`` one (``image_url`` -> ``{"type":
  "image"}``, likewise video and audio);
- an assistant tool call's string ``arguments`` are parsed into a dict;
- ``tools`` are the functions of the request's tools (``tool.function`` with pydantic's defaults
  ``description: null, parameters: null, strict: false``), only the named one for a named
  ``tool_choice``, none for ``"none"``; a template that fails with them is tried once more with each
  wrapped as ``{"function": f}``;
- ``continue_final_message`` with a final assistant message: that message is removed, the rest rendered
  with ``add_generation_prompt=True`` and tokenized, and the tokens of its content (a separate
  ``encode``) appended. The rendered text is HF's ``continue_final_message`` text; the tokens can differ
  from tokenizing that text in one piece only where the BPE pre-tokenizer would join whitespace across
  the seam. Without it a final assistant message with string content becomes a user message
  (``_handle_last_assistant_message``), and ``add_generation_prompt`` is always true, as in SGLang.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from emulator.errors import ApiError

NO_TEMPLATE = (
    "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
    "argument was passed!"
)
_MEDIA = {"image_url": "image", "video_url": "video", "audio_url": "audio"}


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _raise(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _is_content(node: jinja2.nodes.Node) -> bool:
    """``message.content`` or ``message['content']``, possibly under filters/tests (SGLang's check)."""
    while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
        node = node.node
    if isinstance(node, jinja2.nodes.Getattr):
        key: object = node.attr
    elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        key = node.arg.value
    else:
        return False
    owner = node.node
    return key == "content" and isinstance(owner, jinja2.nodes.Name) and owner.name in ("message", "msg", "m")


class ChatTemplate:
    """One compiled template and its content format (``string`` or ``openai``)."""

    def __init__(self, source: str, special_tokens: Mapping[str, Any]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.template = env.from_string(source)
        loops = env.parse(source).find_all(jinja2.nodes.For)
        self.content_format = "openai" if any(_is_content(loop.iter) for loop in loops) else "string"
        self.special_tokens = dict(special_tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """HF's render: the template over these variables (raises jinja2.TemplateError)."""
        return self.template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
            **kwargs,
        )

    def render_request(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, kwargs: Mapping[str, Any]
    ) -> str:
        """SGLang's call: generation prompt on, wrapped tools on a second try; a template error is a 400."""
        try:
            return self.render(messages, tools, True, **kwargs)
        except jinja2.TemplateError as first:
            if not tools:
                raise ApiError(str(first), 400, "BadRequest") from first
        wrapped = [t if isinstance(t, Mapping) and "function" in t else {"function": t} for t in tools]
        try:
            return self.render(messages, wrapped, True, **kwargs)
        except jinja2.TemplateError as err:
            raise ApiError(str(err), 400, "BadRequest") from err

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [sglang_message(m, self.content_format) for m in messages]


def sglang_message(message: Mapping[str, Any], content_format: str) -> dict[str, Any]:
    """One message as SGLang hands it to the template (see the module docstring)."""
    msg = {k: v for k, v in message.items() if v is not None}
    content = msg.get("content", "")
    if isinstance(content, list):
        msg["content"] = _parts(content) if content_format == "openai" else _text(content)
    else:
        msg["content"] = content
    if msg.get("role") == "assistant" and isinstance(msg.get("tool_calls"), list):
        msg["tool_calls"] = [_parsed_call(c) for c in msg["tool_calls"]]
    return msg


def _text(parts: Sequence[Any]) -> str:
    texts = [str(p.get("text") or "") for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
    return " ".join(texts)


def _parts(parts: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        out.append({"type": _MEDIA[kind]} if kind in _MEDIA else part)
    return out


def _parsed_call(call: object) -> object:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    fn = dict(call["function"])
    if isinstance(fn.get("arguments"), str):
        with contextlib.suppress(ValueError):
            fn["arguments"] = json.loads(fn["arguments"])
    return {**call, "function": fn}


def sglang_tools(tools: object, tool_choice: object) -> list[dict[str, Any]] | None:
    """The template's ``tools``: each tool's function with pydantic's defaults, filtered by tool_choice."""
    if not isinstance(tools, list) or not tools or tool_choice == "none":
        return None
    functions = [_function(t.get("function")) for t in tools if isinstance(t, Mapping)]
    named = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    if isinstance(named, Mapping):
        functions = [f for f in functions if f["name"] == named.get("name")]
    return functions


def _function(fn: object) -> dict[str, Any]:
    fn = fn if isinstance(fn, Mapping) else {}
    return {
        "description": fn.get("description"),
        "name": fn.get("name"),
        "parameters": fn.get("parameters"),
        "strict": bool(fn.get("strict", False)),
    }
