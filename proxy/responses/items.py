"""Items as the gateway keeps and lists them: ids, a turn's input, the OpenAI item shape, list pages.

- ``new_id(prefix)``: ``prefix`` + 32 hex digits (``resp_``, ``conv_``, ``msg_``, ...).
- ``turn_input``: what a stored response keeps of its own input, as SGLang keeps its history: a string
  becomes ``{"role": "user", "content": s}``, a list is kept as sent (so a chain, expanded, gives a
  replica exactly the items SGLang's own store would).
- ``listed``: an item as the API lists it (a response's ``input_items``, a conversation's items):
  ``type`` ``message`` when it has none, a string content as one ``input_text`` part (``output_text`` for
  the assistant), ``status`` ``completed``, and an ``id``: its own, else one derived from where it is kept
  (stable across reads). Conversations store their items in this shape, with fresh ids (``with_id``).
- ``page``: a list page (``after``, ``limit`` 1-100 (default 20), ``order`` asc | desc (default desc)) in
  OpenAI's shape ``{"object": "list", "data", "first_id", "last_id", "has_more"}``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.errors import InvalidRequest, NotFound
from proxy.types import JSONObject

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def turn_input(value: object) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def with_id(item: JSONObject) -> JSONObject:
    """``item`` with a fresh id of its kind when it has none (a conversation's items are named so)."""
    if isinstance(item.get("id"), str) and item["id"]:
        return item
    return {**item, "id": new_id(_PREFIXES.get(str(item.get("type", "message")), "item_"))}


def _derived_id(kind: str, where: str, index: int) -> str:
    digest = hashlib.sha256(f"{where}\x00{index}".encode()).hexdigest()[:32]
    return _PREFIXES.get(kind, "item_") + digest


def listed(item: Any, where: str, index: int) -> JSONObject:
    """``item`` in the listed shape (module docstring); ``where`` and ``index`` derive a missing id."""
    out: JSONObject = dict(item) if isinstance(item, Mapping) else {"type": "message", "content": item}
    kind = out.setdefault("type", "message")
    if kind == "message":
        role = out.get("role")
        part = "output_text" if role == "assistant" else "input_text"
        if isinstance(out.get("content"), str):
            text: JSONObject = {"type": part, "text": out["content"]}
            out["content"] = [text | {"annotations": []} if part == "output_text" else text]
        out.setdefault("status", "completed")
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = _derived_id(str(kind), where, index)
    return out


def _limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit")
    try:
        limit = DEFAULT_LIMIT if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return limit


def _order(query: Mapping[str, str]) -> str:
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'", param="order")
    return order


def page(items: Sequence[JSONObject], query: Mapping[str, str]) -> JSONObject:
    """One page of ``items`` (oldest first, each with an ``id``) for the query's after, limit, order."""
    limit, order = _limit(query), _order(query)
    ordered = list(items) if order == "asc" else list(reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise NotFound(f"No item found with id '{after}'.", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {
        "object": "list",
        "data": data,
        "first_id": first,
        "last_id": last,
        "has_more": len(ordered) > limit,
    }
