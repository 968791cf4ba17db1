"""SGLang's error bodies (contract §1.1, §2) and the request-body reader shared by every route.

    OpenAI routes:   {"object": "error", "message", "type", "param": null, "code": <status>}   (flat)
    /generate etc.:  {"error": {"message": ...}}                                             (native)
    /v1/models/{m}:  {"error": {"message", "type", "param", "code"}}                         (nested)
    /v1/responses*:  {"error": {"message", "type", "param", "code": <status>}}               (nested)

Validation failures are 400 "Bad Request" (FastAPI's handler, also for a non-JSON content type);
request-level checks (`_validate_request`, context length) are 400 "BadRequestError".
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


class ApiError(Exception):
    def __init__(
        self, message: str, status: int = 400, type_: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_
        self.param = param  # only the nested /v1/responses shape reports it


def flat_error(status: int, message: str, type_: str) -> web.Response:
    body = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return json_response(body, status)


def nested_error(err: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    """/v1/responses* errors: `{"error": {message, type, param, code: <status>}}`."""
    body = {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.status}}
    return json_response(body, err.status, headers)


def native_error(status: int, message: str) -> web.Response:
    return json_response({"error": {"message": message}}, status)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


async def read_json(request: web.Request, require_json_type: bool = True) -> dict[str, Any]:
    """The body as a JSON object, or ApiError(400, "Bad Request") like FastAPI's validation handler."""
    if require_json_type and request.content_type != "application/json":
        raise ApiError(
            f"Unsupported Media Type: Only 'application/json' is allowed (got {request.content_type!r})",
            400,
            "Bad Request",
        )
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"JSON decode error: {exc}", 400, "Bad Request") from exc
    if not isinstance(body, dict):
        raise ApiError(
            "Input should be a valid dictionary or object to extract fields from", 400, "Bad Request"
        )
    return body


def missing(field: str, model: str) -> ApiError:
    msg = f"1 validation error for {model}\n{field}\n  Field required [type=missing]"
    return ApiError(msg, 400, "Bad Request")


def invalid(field: str, model: str, detail: str) -> ApiError:
    return ApiError(f"1 validation error for {model}\n{field}\n  {detail}", 400, "Bad Request")


def check_context(prompt_tokens: int, max_new: int | None, context_length: int, max_input: int) -> None:
    """SGLang's length checks (tokenizer_manager `_validate_one_request`, then the scheduler's)."""
    if prompt_tokens >= context_length:
        raise ApiError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    if max_new is not None and prompt_tokens + max_new > context_length:
        raise ApiError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {prompt_tokens + max_new} tokens: {prompt_tokens} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit."
        )
    if prompt_tokens > max_input:
        raise ApiError(
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({max_input} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )


def is_token_list(values: list[object]) -> bool:
    """True if every element is a plain int (C-speed: long prompts arrive as token ids)."""
    return set(map(type, values)) <= {int}
