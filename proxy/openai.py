"""Pure parsing and validation of generation request bodies (no I/O).

The gateway validates only what it needs to route and what SGLang would reject anyway with a less
useful message: the body is a JSON object; ``model`` is a string; chat ``messages`` is a non-empty list
of objects with a string ``role``; completions ``prompt`` is a string, a list of strings, a list of token
ids or a list of lists of ids; ``/generate`` has ``text`` or ``input_ids``; ``stream`` is a boolean;
``n`` and the max-token fields are integers. Everything else is the engine's business and is forwarded
untouched: the body bytes the client sent are the bytes the replica gets.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.types import JSONObject, ParsedRequest, Route


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
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InvalidRequest(f"'{key}' must be {what}", param=key)
    if not isinstance(value, kind):
        raise InvalidRequest(f"'{key}' must be {what}", param=key)
    return value


def _model(body: JSONObject) -> str:
    model = body.get("model")
    if model is None:
        raise InvalidRequest("'model' is a required property", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    return model


def _content_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return 0


def _messages_chars(body: JSONObject) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    total = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object with a string 'role'", param=f"messages[{i}]"
            )
        total += _content_chars(m.get("content")) + len(m["role"])
        if isinstance(m.get("tool_calls"), list):
            total += len(orjson.dumps(m["tool_calls"]))
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidRequest("'tools' must be an array", param="tools")
        total += len(orjson.dumps(tools))
    return total


def _prompt_size(value: object, param: str) -> tuple[int, int]:
    """(text chars, token ids) of a completions prompt / generate text or input_ids."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return sum(len(v) for v in value), 0
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return 0, len(value)
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return 0, sum(len(v) for v in value)
    raise InvalidRequest(
        f"'{param}' must be a string, an array of strings, an array of token ids "
        "or an array of arrays of ids",
        param=param,
    )


def _max_new_tokens(body: JSONObject, route: Route) -> int:
    if route is Route.GENERATE:
        sp = _opt(body, "sampling_params", dict, "an object")
        value = (sp or {}).get("max_new_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else 128
    for key in ("max_completion_tokens", "max_tokens"):
        value = _opt(body, key, int, "an integer")
        if value:
            return int(value)
    return 0


def _tenant(body: JSONObject) -> str:
    parts = [body.get("cache_salt"), body.get("extra_key")]
    return "".join(p for p in parts if isinstance(p, str))


def parse_request(route: Route, raw: bytes) -> ParsedRequest:
    """Validates a generation body and measures its prompt; raises InvalidRequest naming the param."""
    body = parse_json(raw)
    model: str | None = None
    if route is Route.CHAT:
        model = _model(body)
        chars, ids = _messages_chars(body), 0
    elif route is Route.COMPLETIONS:
        model = _model(body)
        if "prompt" not in body:
            raise InvalidRequest("'prompt' is a required property", param="prompt")
        chars, ids = _prompt_size(body["prompt"], "prompt")
    elif route is Route.GENERATE:
        key = "text" if body.get("text") is not None else "input_ids"
        if body.get(key) is None:
            raise InvalidRequest("'text' or 'input_ids' is required", param="text")
        chars, ids = _prompt_size(body[key], key)
    else:
        raw_model = body.get("model")
        model = raw_model if isinstance(raw_model, str) and raw_model else None
        chars, ids = len(raw), 0
    stream = bool(_opt(body, "stream", bool, "a boolean"))
    n = _opt(body, "n", int, "an integer")
    if n is not None and n < 1:
        raise InvalidRequest("'n' must be at least 1", param="n")
    user = body.get("user")
    rid = body.get("rid")
    return ParsedRequest(
        route=route,
        model=model,
        stream=stream,
        prompt_chars=chars,
        prompt_token_ids=ids,
        max_new_tokens=_max_new_tokens(body, route),
        user=user if isinstance(user, str) else None,
        tenant=_tenant(body),
        rid=rid if isinstance(rid, str) else None,
        body=body,
    )
