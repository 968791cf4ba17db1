"""What every request must be before any route sees it: a clean path and sane headers.

The request target is read raw (``request.raw_path``, before aiohttp decodes it) and split on ``/``.
Each segment, percent-decoded, must not be:

- ``.`` or ``..``, written raw or percent-encoded (``%2e``, ``.%2E``): a dot segment lets a path that
  starts under one route (``/v1/warmup/../../flush_cache``) name another once a client library or a
  replica resolves it;
- empty (``//``, or a trailing ``/``): no route of kvroute or SGLang has one;
- holding ``/`` or ``\\`` (``%2f``, ``%5c``), a control character (``%00``-``%1f``, ``%7f``) or bytes
  that are not UTF-8: what one parser reads as a separator or a line end, another reads as text.

Any of these is a 400 ``invalid_path`` before routing, authentication or a byte sent upstream. The
query string is not inspected here (handlers read what they use of it).

Headers: a value that is not valid UTF-8 (aiohttp keeps such bytes as surrogates) is a 400
``invalid_header``; the names and values together beyond ``max_header_bytes`` are a 431
``headers_too_large`` (aiohttp bounds one line at 8 KiB, not their number).

Prefixes are matched on whole segments (``has_prefix``): ``/v1/warmupX`` is not under ``/v1/warmup``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import unquote_to_bytes

from aiohttp import web

from proxy.context import GATEWAY
from proxy.errors import GatewayError, InvalidRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_FORBIDDEN = frozenset(range(0x20)) | {0x7F, ord("/"), ord("\\")}


class InvalidPath(InvalidRequest):
    code = "invalid_path"


class InvalidHeader(InvalidRequest):
    code = "invalid_header"


class HeadersTooLarge(GatewayError):
    status, type, code = 431, "invalid_request_error", "headers_too_large"


def segments(path: str) -> list[str]:
    """The raw segments of an absolute path (``/a/b`` → ``["a", "b"]``; ``/`` → ``[]``)."""
    return path[1:].split("/") if path != "/" else []


def has_prefix(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or lies below it, on whole segments."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def has_any_prefix(path: str, prefixes: Iterable[str]) -> bool:
    return any(has_prefix(path, p) for p in prefixes)


def _bad_segment(raw: str) -> str | None:
    """Why one raw segment is refused, or None."""
    if raw == "":
        return "an empty segment"
    decoded = unquote_to_bytes(raw)
    if decoded in (b".", b".."):
        return "a dot segment"
    if any(b in _FORBIDDEN for b in decoded):
        return "an encoded separator or a control character"
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes that are not UTF-8"
    return None


def check_path(raw_path: str) -> None:
    """Raises ``InvalidPath`` for a request target whose path is not plain (module docstring)."""
    path = raw_path.split("?", 1)[0]
    if not path.startswith("/"):
        raise InvalidPath("the request path must be absolute")
    for seg in segments(path):
        why = _bad_segment(seg)
        if why is not None:
            raise InvalidPath(f"the request path holds {why}; send the plain path")


def check_headers(headers: Iterable[tuple[str, str]], max_bytes: int) -> None:
    total = 0
    for name, value in headers:
        total += len(name) + len(value) + 4
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidHeader(f"header {name!r} is not valid UTF-8") from None
    if total > max_bytes:
        raise HeadersTooLarge(
            f"the request headers hold {total} bytes, over the limit of {max_bytes} (max_header_bytes)"
        )


@web.middleware
async def request_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    check_path(request.raw_path)
    check_headers(request.headers.items(), request.app[GATEWAY].settings.max_header_bytes)
    return await handler(request)
