"""The opt-in access log (``--access-log``): one line per answered request, never prompt text.

    kvroute.access: POST /v1/chat/completions 200 replica=http://10.0.0.2:30000 reason=prefix_gpu
                    ttft_ms=412 prompt=6120 cached=6016 completion=211 attempts=1 id=3f9c... ms=2730

``forward`` leaves what it knows on the request (``ACCESS``: replica, reason, TTFT (the first streamed
byte; for an answer that is not streamed, when the whole answer arrived), token counts, the number of
attempts); the errors middleware writes the line once the answer is known, so rejected
requests (400, 404, 413, 503) are logged too, with what was known of them. Logger ``kvroute.access`` at
INFO: route it elsewhere with the logging configuration.

Every field a client chose (the path as sent, the request id) is escaped: a control character, a
space, a quote or a backslash is written as ``\\xNN`` (``\\uNNNN`` beyond Latin-1), and a field is cut at
``MAX_FIELD`` characters, so one request writes exactly one line and cannot forge another or a field.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiohttp import web

log = logging.getLogger("kvroute.access")
MAX_FIELD = 512
_ESCAPED = frozenset(' "\\')


def escaped(text: str) -> str:
    """``text`` as one log field (module docstring)."""
    if text.isprintable() and not _ESCAPED.intersection(text) and len(text) <= MAX_FIELD:
        return text
    out = [c if c.isprintable() and c not in _ESCAPED else _escape(c) for c in text[:MAX_FIELD]]
    return "".join(out) + ("..." if len(text) > MAX_FIELD else "")


def _escape(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


@dataclass(slots=True)
class Access:
    started_s: float
    replica: str = "-"
    reason: str = "-"
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    attempts: int = 0


ACCESS: web.RequestKey[Access] = web.RequestKey("kvroute_access", Access)


def access_of(request: web.Request) -> Access:
    """The request's access record, created at its first use."""
    found = request.get(ACCESS)
    if found is None:
        found = request[ACCESS] = Access(time.monotonic())
    return found


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def log_access(request: web.Request, resp: web.StreamResponse) -> None:
    a = request.get(ACCESS) or Access(time.monotonic())
    ttft = "-" if a.ttft_s is None else f"{a.ttft_s * 1e3:.0f}"
    log.info(
        "%s %s %d replica=%s reason=%s ttft_ms=%s prompt=%s cached=%s completion=%s attempts=%d id=%s"
        " ms=%.0f",
        escaped(request.method),
        escaped(request.raw_path),
        resp.status,
        a.replica,
        a.reason,
        ttft,
        _n(a.prompt_tokens),
        _n(a.cached_tokens),
        _n(a.completion_tokens),
        a.attempts,
        escaped(resp.headers.get("x-request-id") or request.headers.get("x-request-id") or "-"),
        (time.monotonic() - a.started_s) * 1e3,
    )
