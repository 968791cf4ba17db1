"""The bootstrap fields of a PD request (pd-contract.md §1.3, §2.3) and SGLang's PD error messages and shapes.

sglang-router 0.3.2 injects `bootstrap_host` (the prefill URL's host), `bootstrap_port` (its CLI port or
null) and `bootstrap_room` (uniform over 0..2^63-1) at the top level of chat, completions and /generate
bodies; each is a scalar, or a list with one entry per item of a batch (n > 1 chat choices, a list
prompt). The emulator pairs one room per Job (one prompt): job k takes entry k of a list (a chat with n
choices is one Job and takes the first), or room + k of a scalar room (SGLang's
`_normalize_bootstrap_params`). A null or missing port is the server's own --disaggregation-bootstrap-port.
A PD server refuses a request without a room (400, SGLang's message) unless it takes the fake transfer:
`bootstrap_host` 2.2.2.2 (SGLang's FAKE_BOOTSTRAP_HOST) or a decode on the `fake` backend.

Errors (§2.4) keep SGLang's text, `<side> <phase> failed for request rank=0 <rid> <room> with exception
KVTransferError(bootstrap_room=R): <reason>`, and its shapes: a 500 abort is FastAPI's HTTPException body
`{"object":"error","message","type":"500","param":null,"code":500}` (any route); a 400 abort takes the
ValueError path (OpenAI routes: `type` "BadRequestError"; /generate: `{"error":{"message"}}`). In a stream
it is one in-band event, `{"error":{...,"type":"INTERNAL_SERVER_ERROR",...}}` on the OpenAI routes and
`{"error":{"message"}}` on /generate, then `[DONE]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web

from emulator.errors import flat_error, invalid, native_error
from emulator.pd_config import FAKE_BOOTSTRAP_HOST


class PdError(Exception):
    """A PD request that SGLang would abort: its message and status."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Where one Job's KV comes from (decode) or goes (prefill)."""

    host: str | None
    port: int
    room: int | None

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _items(body: dict[str, Any], key: str, model: str, kind: type, nullable: bool = False) -> list[Any]:
    """The field as a list (a scalar is a list of one; absent or null: empty); ApiError for bad types."""
    value = body.get(key)
    values = [] if value is None else value if isinstance(value, list) else [value]
    ok = all((v is None and nullable) or (isinstance(v, kind) and not isinstance(v, bool)) for v in values)
    if not ok:
        raise invalid(key, model, f"Input should be a valid {kind.__name__} or a list of them")
    return values


def parse_bootstrap(body: dict[str, Any], jobs: int, own_port: int, model: str) -> tuple[Bootstrap, ...]:
    """One Bootstrap per Job of the request; ApiError (400) for fields of the wrong type."""
    hosts = _items(body, "bootstrap_host", model, str)
    ports = _items(body, "bootstrap_port", model, int, nullable=True)
    rooms = _items(body, "bootstrap_room", model, int)
    out = []
    for k in range(jobs):
        host = hosts[min(k, len(hosts) - 1)] if hosts else None
        port = ports[min(k, len(ports) - 1)] if ports else None
        room = None
        if rooms:
            room = rooms[k] if len(rooms) > 1 and k < len(rooms) else rooms[0] + k
        out.append(Bootstrap(host, own_port if port is None else port, room))
    return tuple(out)


# ---- SGLang's messages ----------------------------------------------------------------------------
def missing_room(rid: str) -> PdError:
    msg = f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={rid}"
    return PdError(msg, 400)


def kv_error(room: int, reason: str) -> str:
    return f"KVTransferError(bootstrap_room={room}): {reason}"


def prefill_failed(phase: str, rid: str, room: int, reason: str) -> PdError:
    """phase: "bootstrap" (waiting for the decode) or "transfer" (sending the KV)."""
    head = f"Prefill {phase} failed for request rank=0 req.rid={rid!r} req.bootstrap_room={room}"
    return PdError(f"{head} with exception {kv_error(room, reason)}")


def decode_failed(phase: str, rid: str, room: int, reason: str) -> PdError:
    """phase: "handshake" (resolving the prefill) or "transfer" (waiting for the KV)."""
    head = f"Decode {phase} failed for request rank=0 decode_req.req.rid={rid!r}"
    head += f" decode_req.req.bootstrap_room={room}"
    return PdError(f"{head} with exception {kv_error(room, reason)}")


# ---- shapes ---------------------------------------------------------------------------------------
def openai_error(err: PdError) -> web.Response:
    type_ = "BadRequestError" if err.status == 400 else str(err.status)
    return flat_error(err.status, err.message, type_)


def native_error_response(err: PdError) -> web.Response:
    if err.status == 400:
        return native_error(400, err.message)
    return flat_error(err.status, err.message, str(err.status))


def openai_error_event(message: str, status: int) -> dict[str, Any]:
    body = {"object": "error", "message": message, "type": HTTPStatus(status).name}
    return {"error": body | {"param": None, "code": status}}


def native_error_event(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}
