"""Pure parsing and validation of generation request bodies (no I/O), once per request.

The gateway validates only what it needs to route and what SGLang would reject anyway with a less
useful message: the body is a JSON object; ``model`` is a string; chat ``messages`` is a non-empty list
of objects with a string ``role``; completions ``prompt`` is a string, a list of strings, a list of token
ids or a list of lists of ids; ``/generate`` has ``text`` or ``input_ids``; ``stream`` is a boolean;
``n`` is an integer in [1, 128] (OpenAI's bound: SGLang has none, and a huge ``n`` would keep an engine
busy for ever) and the max-token fields are integers. Everything else is the engine's business and is
forwarded untouched: the body bytes the client sent are the bytes the replica gets.

What routing needs is built here, in one pass, as a typed ``routing.prompt.PromptRequest``: the prompt
(chat messages with tools and template options, text, or token ids; a batch by its first prompt), the
cache namespace (``cache_salt``, ``extra_key``, ``lora_path``), the session key (a conversation key from
a header or a configured body field; never ``user``) and the engine's output budget: chat
``max_completion_tokens or max_tokens`` (0 means unset, as in SGLang), completions ``max_tokens``
(SGLang's default 16), ``/generate`` ``sampling_params.max_new_tokens`` (default 128; 0 is a
prefill-only request).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.types import JSONObject, ParsedRequest, Route
from routing.canonical import TEMPLATE_OPTIONS
from routing.prompt import ChatPrompt, Message, Namespace, Prompt, PromptRequest, TextPrompt, TokenPrompt

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # SGLang's CompletionRequest default
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default
MAX_N = 128  # OpenAI's bound on choices per request; SGLang has none (n = 2**63 - 1 would spin forever)


def parse_json(raw: bytes) -> JSONObject:
    if not raw:
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _opt(body: JSONObject, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kind):
        raise InvalidRequest(f"'{key}' must be {what}", param=key)
    return value


def _model(body: JSONObject) -> str:
    model = body.get("model")
    if model is None:
        raise InvalidRequest("'model' is a required property", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    return model


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _message(i: int, m: object) -> Message:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise InvalidRequest(
            f"'messages[{i}]' must be an object with a string 'role'", param=f"messages[{i}]"
        )
    return Message(
        m["role"], m.get("content"), _str(m.get("name")), m.get("tool_calls"), _str(m.get("tool_call_id"))
    )


def _chat(body: JSONObject) -> ChatPrompt:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    tools = _opt(body, "tools", list, "an array")
    options = tuple((k, body[k]) for k in TEMPLATE_OPTIONS if body.get(k) is not None)
    return ChatPrompt(tuple(_message(i, m) for i, m in enumerate(messages)), tools, options)


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _text_or_ids(value: object, param: str) -> Prompt:
    """A completions prompt / generate text or input_ids; a batch is represented by its first prompt."""
    if isinstance(value, str):
        return TextPrompt(value)
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return TextPrompt(value[0])
        if _is_ids(value):
            return TokenPrompt(tuple(value))
        if all(_is_ids(v) for v in value):
            return TokenPrompt(tuple(value[0]))
    raise InvalidRequest(
        f"'{param}' must be a string, an array of strings, an array of token ids "
        "or an array of arrays of ids",
        param=param,
    )


def _prompt(route: Route, body: JSONObject) -> Prompt | None:
    if route is Route.CHAT:
        return _chat(body)
    if route is Route.COMPLETIONS:
        if "prompt" not in body:
            raise InvalidRequest("'prompt' is a required property", param="prompt")
        return _text_or_ids(body["prompt"], "prompt")
    if route is Route.GENERATE:
        key = "text" if body.get("text") is not None else "input_ids"
        if body.get(key) is None:
            raise InvalidRequest("'text' or 'input_ids' is required", param="text")
        return _text_or_ids(body[key], key)
    return None


def _max_new_tokens(body: JSONObject, route: Route) -> int | None:
    if route is Route.GENERATE:
        sp = body.get("sampling_params")
        value = sp.get("max_new_tokens") if isinstance(sp, dict) else None
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return value if ok else GENERATE_DEFAULT_MAX_NEW_TOKENS
    if route is Route.PASSTHROUGH:
        return None
    keys = ("max_completion_tokens", "max_tokens") if route is Route.CHAT else ("max_tokens",)
    for key in keys:
        value = _opt(body, key, int, "an integer")
        if value:
            return int(value)
    return COMPLETIONS_DEFAULT_MAX_TOKENS if route is Route.COMPLETIONS else None


def _namespace(body: JSONObject) -> Namespace:
    return Namespace(
        cache_salt=_str(body.get("cache_salt")) or "",
        extra_key=_str(body.get("extra_key")) or "",
        lora=_str(body.get("lora_path")) or "",
    )


def _route_model(route: Route, body: JSONObject) -> str | None:
    if route in (Route.CHAT, Route.COMPLETIONS):
        return _model(body)
    return _str(body.get("model"))


def session_key(body: JSONObject, field: str | None) -> str | None:
    """The body's conversation key at the dotted path ``field`` (e.g. ``metadata.session_id``), when it is
    a non-empty string or an integer. OpenAI's ``user`` names the end user, not a conversation: many
    users ask about one document, and one user holds many conversations, so it is never used."""
    value: object = body
    for part in field.split(".") if field else ():
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(value) if field else None


def parse_request(
    route: Route, raw: bytes, session: str | None = None, session_field: str | None = None
) -> ParsedRequest:
    """Validates a generation body and builds what routing needs; raises InvalidRequest naming the param.

    ``session`` is the conversation key from the request headers, when there is one; else the body
    field ``session_field`` names (``session_key``)."""
    body = parse_json(raw)
    model = _route_model(route, body)
    prompt = _prompt(route, body)
    stream = bool(_opt(body, "stream", bool, "a boolean"))
    n = _opt(body, "n", int, "an integer")
    if n is not None and not 1 <= n <= MAX_N:
        raise InvalidRequest(f"'n' must be between 1 and {MAX_N}", param="n")
    session = session or session_key(body, session_field)
    request = PromptRequest(
        model or "", prompt, _namespace(body), session, _max_new_tokens(body, route), len(raw)
    )
    return ParsedRequest(route, model, stream, _str(body.get("rid")), request, body)


def passthrough_request(
    raw: bytes, path: str, session: str | None = None, session_field: str | None = None
) -> ParsedRequest:
    """A pass-through request to ``path``: routed by size, and by its ``model`` when the body names one;
    ``body`` is empty when the bytes are not a JSON object."""
    try:
        parsed = parse_request(Route.PASSTHROUGH, raw, session, session_field)
    except InvalidRequest:
        parsed = ParsedRequest(
            Route.PASSTHROUGH, None, False, None, PromptRequest("", None, size_bytes=len(raw))
        )
    return dataclasses.replace(parsed, path=path)
