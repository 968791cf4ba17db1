"""The gateway's error tree and its OpenAI-shaped JSON.

Every error the gateway itself produces is a ``GatewayError`` carrying an HTTP status and an OpenAI
error ``type``; it renders as ``{"error": {"message", "type", "param", "code"}}`` (the shape the
``openai`` SDK parses into its typed exceptions)::

    GatewayError(status, type)
    ├── InvalidRequest 400 · Unauthorized 401 · Forbidden 403 · NotFound 404 · MethodNotAllowed 405
    │   └── ModelNotFound 404
    ├── RequestTimeout 408 · PayloadTooLarge 413 · Overloaded 429 ── RateLimited 429
    ├── NoReplicaAvailable 503 · Draining 503 · LimitsUnavailable 503
    └── UpstreamError 502 ── UpstreamTimeout 504 · UpstreamUnavailable 502

aiohttp's client exceptions become ``UpstreamError`` in exactly one place, ``proxy/upstream/client.py``.
An upstream that *answers* with an error status is not an exception: its response is relayed, in
OpenAI's shape on the OpenAI routes (``openai_error_body``), or retried on another replica when that is
safe (``proxy/dispatch/forward.py``). Once a stream has
started, the status can no longer change: the handler sends one SSE error event and closes.
An error with ``retry_after`` (seconds) is sent with a ``Retry-After`` header (429s, the drain's 503).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


class GatewayError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if retry_after is not None:
            self.retry_after = retry_after

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_json(self) -> bytes:
        return orjson.dumps(self.payload())

    def to_response(self, headers: dict[str, str] | None = None) -> web.Response:
        if self.retry_after is not None:
            headers = {**(headers or {}), "Retry-After": str(self.retry_after)}
        return web.Response(
            status=self.status, body=self.to_json(), content_type="application/json", headers=headers
        )

    def to_sse(self) -> bytes:
        """The one in-band event sent when a stream fails after its first byte."""
        return b"data: " + self.to_json() + b"\n\n"


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, method: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"{method} is not allowed here; use {' or '.join(allowed)}")
        self.allowed = allowed

    def to_response(self, headers: dict[str, str] | None = None) -> web.Response:
        return super().to_response({**(headers or {}), "Allow": ", ".join(self.allowed)})


class RequestTimeout(GatewayError):
    """The client did not send its request body in time (``--body-timeout``)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class Overloaded(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"


class RateLimited(Overloaded):
    """A tenant went past its requests or tokens per minute (``proxy/tenancy/rate_limit.py``)."""

    code = "rate_limit_exceeded"


class NoReplicaAvailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_replica_available"


class Draining(GatewayError):
    """The gateway is shutting down (SIGTERM): another gateway should take the request."""

    status = 503
    type = "service_unavailable"
    code = "draining"


class LimitsUnavailable(GatewayError):
    """``--limits-when-store-down closed``: the shared rate limits cannot be checked
    (``proxy/tenancy/shared_limits.py``)."""

    status = 503
    type = "service_unavailable"
    code = "rate_limits_unavailable"


class UpstreamError(GatewayError):
    """The replica failed in a way that is not an HTTP answer (connection, protocol, timeout)."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = False  # safe to send the same request to another replica (nothing reached the engine)


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"

    def __init__(self, message: str, *, retryable: bool, unreachable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.unreachable = unreachable  # could not connect at all: the replica looks down


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable  # no first byte yet: nothing reached the client, try another replica


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_body(status: int, body: bytes) -> bytes | None:
    """An error body a replica sent in another shape (FastAPI's ``{"detail": ...}``, SGLang's flat
    ``{"object": "error", "message": ...}``, plain text), re-shaped as OpenAI's; None when it already is
    (or is no error). Used on the OpenAI routes (``proxy/dispatch/forward.py``); ``/generate`` relays
    SGLang's native errors as they are."""
    if status < 400:
        return None
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict) and "message" in doc["error"]:
        return None
    message: object = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    if isinstance(doc, dict):
        message = doc.get("message") or doc.get("detail") or message
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "upstream_error")
    text = message if isinstance(message, str) else orjson.dumps(message).decode()
    return orjson.dumps({"error": {"message": text, "type": kind, "param": None, "code": status}})
