"""What a replica is for in a prefill/decode (PD) disaggregated fleet, and the bootstrap fields it needs.

A replica is ``unified`` (an ordinary SGLang server: prefill and decode), a ``prefill`` server or a
``decode`` server (pd-contract.md §2.1, ``--disaggregation-mode``). Its role comes from what it reports,
``disaggregation_mode`` in ``/server_info`` (``null`` is unified), and from what the settings declare
(``--prefill``, ``--decode``; a ``--backend`` declares nothing). A server that reports no mode at all
(not SGLang) takes the declared role; one that reports a mode other than the declared one is a
misconfiguration: ``role_of`` names the conflict and the fleet keeps the replica out of the pool.

A PD server needs three fields in every generation body (pd-contract.md §1.3): ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room``. ``with_fields`` writes them into a JSON body: spliced after the
opening brace, so the rest of the client's bytes are the replica's bytes, unless the body already has
one of them (re-serialized then, ours replacing the client's: a client never picks a room).
``FAKE_BOOTSTRAP`` is SGLang's fake transfer (``FAKE_BOOTSTRAP_HOST`` 2.2.2.2, room 0): a prefill server
computes a request with it and needs no decode, as SGLang's own ``/health`` and warm-up do (§2.6); the
gateway's warm-up steps use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson

Role = Literal["unified", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("unified", "prefill", "decode")
_MODES: dict[str, Role] = {"null": "unified", "prefill": "prefill", "decode": "decode"}
BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
FAKE_BOOTSTRAP: Mapping[str, Any] = {"bootstrap_host": "2.2.2.2", "bootstrap_room": 0}


def role_of(declared: Role | None, reported: str | None) -> tuple[Role, str | None]:
    """The replica's role and, when what it reports contradicts what was declared, why it is kept out."""
    mode = _MODES.get(reported) if reported is not None else None
    if mode is None:
        return declared or "unified", None
    if declared is not None and declared != mode:
        flag = "--backend" if declared == "unified" else f"--{declared}"
        return declared, f"declared a {declared} server ({flag}) but reports disaggregation_mode {reported}"
    return mode, None


def with_fields(raw: bytes, body: Mapping[str, Any], fields: Mapping[str, Any]) -> bytes:
    """``raw`` (the JSON object ``body``) with ``fields`` set (module docstring)."""
    if any(k in body for k in BOOTSTRAP_KEYS):
        return orjson.dumps({**body, **fields})
    start = raw.find(b"{")
    if start < 0:
        return orjson.dumps({**body, **fields})
    head = orjson.dumps(dict(fields))[1:-1]
    empty = raw[start + 1 :].lstrip().startswith(b"}")
    return raw[: start + 1] + head + (b"" if empty else b",") + raw[start + 1 :]
