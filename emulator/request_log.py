"""What a replica received (only with --emu-debug): a bounded log of requests and of abort calls.

A router's tests need to see the replica's side of the wire without a second, hand-written fake: which
path and method arrived, with which headers, and whether the body is byte-for-byte what the client sent.
Bodies are never stored, only their length and SHA-256 (compare with the SHA-256 of the bytes the client
sent); secrets in headers (Authorization, Cookie, API keys) are masked.

Each entry is written when the request arrives (so a hanging request is visible) and completed when its
handler ends, with an outcome:

    "pending"    the handler is still running
    "answered"   a response was returned (`status` holds its HTTP status; a stream may still be cut)
    "cancelled"  the client (e.g. a gateway) closed the connection before the answer was complete: the
                 handler was cancelled, or its next write found the connection closed
    "reset"      a "reset" fault closed the connection before any byte

Probes a router sends every few seconds (health, readiness, server/model info, loads, metrics) and the
emulator's own /_emu/ routes are not logged, so they cannot push real requests out of the window.
`POST /abort_request` calls are logged like any request, and their `rid`s are kept in `AbortLog`.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

LOG_SIZE = 512
SECRET_HEADERS = frozenset({"authorization", "cookie", "x-api-key", "api-key", "proxy-authorization"})
PROBE_PATHS = frozenset(
    {
        "/health",
        "/health_generate",
        "/ready",
        "/metrics",
        "/server_info",
        "/get_server_info",
        "/model_info",
        "/get_model_info",
        "/get_load",
        "/v1/loads",
    }
)


def is_logged(path: str) -> bool:
    return path not in PROBE_PATHS and not path.startswith("/_emu/")


@dataclass(slots=True)
class Entry:
    """One received request (mutable only until its handler ends)."""

    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body_bytes: int
    body_sha256: str
    received_at: float  # wall-clock time
    outcome: str = "pending"
    status: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body_bytes": self.body_bytes,
            "body_sha256": self.body_sha256,
            "received_at": self.received_at,
            "outcome": self.outcome,
            "status": self.status,
        }


class RequestLog:
    """The last `size` requests; `total` counts every logged request since start."""

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._entries: deque[Entry] = deque(maxlen=size)
        self.total = 0

    def record(self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> Entry:
        self.total += 1
        entry = Entry(
            seq=self.total,
            method=method,
            path=path,
            query=query,
            headers={k.lower(): _mask(k, v) for k, v in headers.items()},
            body_bytes=len(body),
            body_sha256=hashlib.sha256(body).hexdigest(),
            received_at=time.time(),
        )
        self._entries.append(entry)
        return entry

    def to_json(self, path: str | None = None) -> dict[str, object]:
        entries = [e.to_json() for e in self._entries if path is None or e.path == path]
        return {"total": self.total, "requests": entries}


class AbortLog:
    """`rid`s named by /abort_request calls (the last `size`), and how many calls arrived."""

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._rids: deque[str | None] = deque(maxlen=size)
        self.total = 0

    def record(self, rid: str | None) -> None:
        self.total += 1
        self._rids.append(rid)

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "rids": list(self._rids)}


def _mask(name: str, value: str) -> str:
    return "***" if name.lower() in SECRET_HEADERS else value
