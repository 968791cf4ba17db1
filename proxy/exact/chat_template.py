"""A model's chat template rendered as the engine renders it: HF transformers' jinja2 setup, fed the
messages SGLang's OpenAI chat route builds from a request body.

The environment is transformers' ``_compile_jinja_template``: an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that is
``json.dumps(x, ensure_ascii=False, ...)`` (not jinja's HTML-escaping one), ``raise_exception`` and
``strftime_now``. The variables are ``messages``, ``tools``, ``add_generation_prompt`` and the special
tokens of ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...), plus the request's
``chat_template_kwargs`` and ``reasoning_effort``.

What SGLang (``serving_chat._apply_jinja_template``) does to the body before rendering, mirrored here:

- ``content: null`` becomes ``""``; a list of parts is kept for templates that iterate over content
  ("openai" content format) and flattened to its text parts joined by one space otherwise ("string"
  format, detected from the template source). Non-text parts (images, audio, video) are not rendered
  here: ``Unrenderable`` (the gateway keeps its text keys for such a request).
- assistant ``tool_calls`` whose ``arguments`` is a JSON string get them parsed;
- ``tools`` are the tools' functions with pydantic's defaults (``description``/``parameters`` null,
  ``strict`` false), none for ``tool_choice: "none"``, the named one only for a named choice; a template
  that fails with them is tried once more with each wrapped as ``{"function": f}``;
- a final assistant message with string content is removed and its content appended after the rendered
  prompt when ``continue_final_message`` is set, and becomes a user message when it is not;
- ``add_generation_prompt`` is always true (SGLang does not read the request's field).

Rendered text = template output + the continued assistant content; it is then encoded with
``add_special_tokens=False`` (``proxy/exact/tokenizer.py``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy.types import JSONObject

_ITERATES_CONTENT = re.compile(r"""for\s+\w+\s+in\s+[\w.]*(\.content|\[\s*['"]content['"]\s*\])""")


_TEMPLATE_ERRORS = (TemplateError, TypeError, ValueError, KeyError, AttributeError)


class Unrenderable(Exception):
    """The request cannot be rendered to the engine's text here; ``reason`` is a metric label
    (``template``: the template raised; ``multimodal``: non-text content parts; ``malformed``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled chat template with its special-token variables."""

    def __init__(self, source: str, special_tokens: dict[str, Any]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._special = special_tokens
        self.openai_content = bool(_ITERATES_CONTENT.search(source))

    def render(self, body: JSONObject) -> str:
        """The prompt text SGLang encodes for a chat body (module docstring); raises ``Unrenderable``."""
        messages = [self._message(m) for m in body.get("messages") or ()]
        messages, prefix = _last_assistant(messages, bool(body.get("continue_final_message")))
        kwargs = dict(self._special)
        if body.get("reasoning_effort") is not None:
            kwargs["reasoning_effort"] = body["reasoning_effort"]
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        tools = _tools(body)
        kwargs.update(messages=messages, tools=tools, add_generation_prompt=True)
        try:
            return self._render(kwargs) + (prefix or "")
        except _TEMPLATE_ERRORS as e:
            if not tools:
                raise Unrenderable("template") from e
        kwargs["tools"] = [{"function": f} for f in tools]  # SGLang's second try: the tools wrapped
        try:
            return self._render(kwargs) + (prefix or "")
        except _TEMPLATE_ERRORS as e:
            raise Unrenderable("template") from e

    def _render(self, kwargs: dict[str, Any]) -> str:
        return self._template.render(**kwargs)

    def _message(self, m: Any) -> JSONObject:
        if not isinstance(m, dict):
            raise Unrenderable("malformed")
        out = {k: v for k, v in m.items() if v is not None}
        out["content"] = self._content(m.get("content"))
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = [_parsed_arguments(c) for c in calls]
        return out

    def _content(self, content: Any) -> Any:
        if content is None:
            return ""
        if not isinstance(content, list):
            return content
        parts = [p for p in content if isinstance(p, dict)]
        if len(parts) != len(content):
            raise Unrenderable("malformed")
        if any(p.get("type", "text") != "text" for p in parts):
            raise Unrenderable("multimodal")
        if self.openai_content:
            return parts
        return " ".join(str(p.get("text", "")) for p in parts)


def _parsed_arguments(call: Any) -> Any:
    """A tool call whose ``function.arguments`` is a JSON string, with them parsed (as SGLang does)."""
    fn = call.get("function") if isinstance(call, dict) else None
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if not isinstance(fn, dict) or not isinstance(args, str):
        return call
    try:
        parsed = json.loads(args)
    except ValueError:
        return call
    return {**call, "function": {**fn, "arguments": parsed}} if isinstance(parsed, dict) else call


def _tools(body: JSONObject) -> list[Any] | None:
    """The template's ``tools`` as SGLang builds them: each tool's ``function`` with pydantic's defaults
    (``description`` and ``parameters`` null, ``strict`` false), only the named one for a named
    ``tool_choice``, none for ``"none"``."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    functions = [_function(t.get("function")) for t in tools if isinstance(t, dict)]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return [f for f in functions if f["name"] == name]
    return functions


def _function(fn: Any) -> JSONObject:
    fn = fn if isinstance(fn, dict) else {}
    return {
        "description": fn.get("description"),
        "name": fn.get("name"),
        "parameters": fn.get("parameters"),
        "strict": bool(fn.get("strict", False)),
    }


def _last_assistant(messages: list[JSONObject], continue_final: bool) -> tuple[list[JSONObject], str | None]:
    """SGLang's ``_handle_last_assistant_message``: a final assistant message with string content is
    continued (removed, its content returned) or, without ``continue_final_message``, made a user turn."""
    if not messages or messages[-1].get("role") != "assistant":
        return messages, None
    content = messages[-1].get("content")
    if not isinstance(content, str):
        return messages, None
    if continue_final:
        return messages[:-1], content
    return [*messages[:-1], {"role": "user", "content": content}], None
