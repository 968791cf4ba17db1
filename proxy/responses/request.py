"""A ``POST /v1/responses`` body: what the gateway checks and reads of it, and what a replica gets (pure).

The gateway checks what it acts on (400 ``invalid_request_error`` naming the field, OpenAI's shape):
the body is a JSON object; ``model`` a non-empty string; ``input`` a string or an array of objects;
``stream``, ``store`` and ``background`` booleans; ``previous_response_id`` a string starting with
``resp_``; ``conversation`` a ``conv_`` id or ``{"id": ...}``, and not with ``previous_response_id``;
``background`` only with ``store`` (SGLang's "background=true requires store=true."); ``metadata`` an
object of at most 16 string values; ``max_output_tokens`` an integer. Everything else is the replica's
business (it answers its own 400s, relayed as they are).

``upstream_body`` is what the replica gets: the client's fields, with ``input`` = the chain's (or the
conversation's) items then this turn's, ``store: false``, ``request_id`` = the id the gateway minted
(SGLang's ``rid`` too: cancel aborts it), ``model`` = the served model, and without
``previous_response_id``, ``conversation`` and ``background``: any replica can answer it, whatever its
``--enable-response-store``. ``parsed`` is the request routing gets: a chat prompt
(``proxy/responses/chat_view.py``), the namespace, the session key, the budget ``max_output_tokens - 2``
(SGLang's ``max_new_tokens``), as ``proxy/front/openai.py`` builds one for chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequest
from proxy.front.openai import parse_json, session_key
from proxy.responses.chat_view import chat_prompt
from proxy.responses.items import turn_input
from proxy.types import JSONObject, ParsedRequest, Route
from routing.prompt import Namespace, PromptRequest

MAX_METADATA = 16
_GATEWAY_FIELDS = ("previous_response_id", "conversation", "background", "store", "request_id")


@dataclass(frozen=True, slots=True)
class CreateRequest:
    body: JSONObject  # the client's body, as sent
    model: str
    stream: bool
    store: bool
    background: bool
    previous_response_id: str | None
    conversation: str | None

    @property
    def input(self) -> list[Any]:
        """This turn's own input items (a string as one user message)."""
        return turn_input(self.body.get("input"))


def _flag(body: JSONObject, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be a boolean", param=key)
    return value


def _model(body: JSONObject) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: a non-empty string", param="model")
    return model


def _input(body: JSONObject) -> None:
    value = body.get("input")
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
        raise InvalidRequest("'input' must be a string or an array of input items (objects)", param="input")


def _previous(body: JSONObject) -> str | None:
    value = body.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("resp_"):
        raise InvalidRequest(
            f"Invalid 'previous_response_id': {value!r}. Expected an ID that begins with 'resp_'.",
            param="previous_response_id",
        )
    return value


def conversation_id(value: object) -> str | None:
    """``conversation`` as sent: a ``conv_`` id, or an object with one."""
    if value is None:
        return None
    cid = value.get("id") if isinstance(value, dict) else value
    if not isinstance(cid, str) or not cid.startswith("conv_"):
        raise InvalidRequest(
            "'conversation' must be a conversation id ('conv_...') or an object with one",
            param="conversation",
        )
    return cid


def check_metadata(value: object) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise InvalidRequest(f"'metadata' must be an object of at most {MAX_METADATA} keys", param="metadata")
    if not all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()):
        raise InvalidRequest(
            "'metadata' values must be strings (keys up to 64, values up to 512)", param="metadata"
        )


def parse_create(raw: bytes) -> CreateRequest:
    """The checks of the module docstring; raises ``InvalidRequest``."""
    body = parse_json(raw)
    model = _model(body)
    _input(body)
    check_metadata(body.get("metadata"))
    budget = body.get("max_output_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise InvalidRequest("'max_output_tokens' must be an integer", param="max_output_tokens")
    previous, conversation = _previous(body), conversation_id(body.get("conversation"))
    if previous is not None and conversation is not None:
        raise InvalidRequest(
            "'previous_response_id' and 'conversation' cannot be used together", param="conversation"
        )
    stream, store = _flag(body, "stream", False), _flag(body, "store", True)
    background = _flag(body, "background", False)
    if background and not store:
        raise InvalidRequest("background=true requires store=true.", param="store")
    return CreateRequest(body, model, stream, store, background, previous, conversation)


def upstream_body(req: CreateRequest, history: list[Any], rid: str, model: str) -> JSONObject:
    """The body a replica gets (module docstring)."""
    body = {k: v for k, v in req.body.items() if k not in _GATEWAY_FIELDS}
    body |= {"model": model, "input": [*history, *req.input], "store": False, "request_id": rid}
    return body


def parsed_request(
    body: JSONObject, size: int, session: str | None, session_field: str | None
) -> ParsedRequest:
    """What routing gets of the body a replica gets (module docstring)."""
    budget = body.get("max_output_tokens")
    ns = Namespace(cache_salt=_str(body.get("cache_salt")), extra_key=_str(body.get("extra_key")))
    prompt = chat_prompt(body["input"], body)
    session = session or session_key(body, session_field)
    new_tokens = budget - 2 if isinstance(budget, int) and budget > 2 else None
    routing = PromptRequest(body["model"], prompt, ns, session, new_tokens, size)
    return ParsedRequest(
        Route.RESPONSES, body["model"], bool(body.get("stream")), body["request_id"], routing, body
    )


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
