"""Limits on what a generation body may hold, beyond its size (``max_body_bytes``, 413 when read).

- ``max_messages``: chat messages per request, or Responses input items (the chain expanded) (400
  ``too_many_messages``);
- ``max_field_bytes``: the UTF-8 bytes of any one string anywhere in the body, keys included (413
  ``field_too_large``);
- ``max_json_depth``: nesting of objects and arrays, the body itself being depth 1 (400 ``too_deep``).

Each error names the limit, its setting and the top-level field where it was found. The walk over the
body only runs when a limit could be reached: the body is longer than ``max_field_bytes``, or holds more
brackets than ``max_json_depth`` (a prompt of token ids has one); so an ordinary request pays two
``bytes.count`` calls and nothing else.
"""

from __future__ import annotations

from typing import Any

from proxy.config.settings import Settings
from proxy.errors import InvalidRequest, PayloadTooLarge
from proxy.types import ParsedRequest, Route


class TooDeep(InvalidRequest):
    code = "too_deep"


class TooManyMessages(InvalidRequest):
    code = "too_many_messages"


class FieldTooLarge(PayloadTooLarge):
    code = "field_too_large"


_LISTS = {Route.CHAT: ("messages", "messages"), Route.RESPONSES: ("input", "input items")}  # max_messages


def check_limits(parsed: ParsedRequest, raw: bytes, st: Settings) -> None:
    """Raises the error of the first limit the body goes past."""
    key, what = _LISTS.get(parsed.route, ("", ""))
    messages = parsed.body.get(key) if key else None
    if isinstance(messages, list) and len(messages) > st.max_messages:
        raise TooManyMessages(
            f"{len(messages)} {what} exceed the limit of {st.max_messages} (max_messages)", param=key
        )
    sizes = len(raw) > st.max_field_bytes
    depth = raw.count(b"[") + raw.count(b"{") > st.max_json_depth
    if sizes or depth:
        for key, value in parsed.body.items():
            _walk(key, value, st.max_field_bytes if sizes else 0, st.max_json_depth if depth else 0)
            _check_str(key, key, st.max_field_bytes if sizes else 0)


def _check_str(value: str, param: str, max_bytes: int) -> None:
    if max_bytes and len(value) * 4 > max_bytes and len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise FieldTooLarge(
            f"a string in '{param}' exceeds the limit of {max_bytes} bytes (max_field_bytes)", param=param
        )


def _walk(param: str, value: Any, max_bytes: int, max_depth: int) -> None:
    """One top-level field (depth 2) and everything inside it, iteratively."""
    stack: list[tuple[Any, int]] = [(value, 2)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            _check_str(v, param, max_bytes)
            continue
        if not isinstance(v, dict | list):
            continue
        if max_depth and d > max_depth:
            raise TooDeep(
                f"'{param}' nests deeper than the limit of {max_depth} (max_json_depth)", param=param
            )
        if isinstance(v, dict):
            for k, item in v.items():
                _check_str(k, param, max_bytes)
                stack.append((item, d + 1))
        else:
            stack.extend((item, d + 1) for item in v if isinstance(item, str | dict | list))
