"""The bootstrap fields of one pair attempt (pd-contract.md §1.3): the prefill's host and port, and a room.

- room: ``secrets.randbits(63)``, uniform over [1, 2^63 - 1] (0 is SGLang's room for "not ready" and
  health probes), a fresh one for every attempt, as sglang-router draws one per retry;
- host: the prefill URL's host (an IPv6 address keeps its brackets), as sglang-router's ``host_str``;
  port: the prefill's configured or reported bootstrap port, else JSON null (the decode server then uses
  its own ``--disaggregation-bootstrap-port``, as SGLang does);
- a batch gets one room per item and the three fields as arrays where sglang-router finds one: chat
  with ``n`` > 1, completions whose ``prompt`` is a list of prompts (strings or id lists), ``/generate``
  whose ``input_ids`` is a list of id lists; anything else gets scalars (SGLang expands a scalar room to
  room + i per item on both servers alike).

Both servers get the same bytes: the client's body with the fields written in
(``proxy.fleet.roles.with_fields``).
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlsplit

from proxy.fleet.roles import with_fields
from proxy.types import ParsedRequest, Route


def new_room() -> int:
    return secrets.randbits(63) or 1


def bootstrap_host(url: str) -> str:
    """The host of a prefill URL, without userinfo and port; an IPv6 address keeps its brackets."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    if netloc.startswith("["):
        return netloc[: netloc.index("]") + 1]
    return netloc.partition(":")[0] or "localhost"


def batch_size(parsed: ParsedRequest) -> int | None:
    """How many rooms the request needs as an array (None: scalar fields)."""
    body = parsed.body
    if parsed.route is Route.CHAT:
        n = body.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else None
    items = body.get("prompt") if parsed.route is Route.COMPLETIONS else body.get("input_ids")
    if not isinstance(items, list) or not items or isinstance(items[0], int):
        return None
    if parsed.route is Route.GENERATE and not isinstance(items[0], list):
        return None
    return len(items)


def pair_body(raw: bytes, parsed: ParsedRequest, prefill: str, port: int | None) -> tuple[bytes, list[int]]:
    """The body both servers of a pair get, and its rooms (one, or one per batch item)."""
    size = batch_size(parsed)
    rooms = [new_room() for _ in range(size or 1)]
    host = bootstrap_host(prefill)
    fields: dict[str, Any] = (
        {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": rooms[0]}
        if size is None
        else {"bootstrap_host": [host] * size, "bootstrap_port": [port] * size, "bootstrap_room": rooms}
    )
    return with_fields(raw, parsed.body, fields), rooms
