"""A small HTTP client for SGLang's native endpoints (contract §1.1, §1.2), as the diagnostics use them.

- ``get_json(path)``: a JSON document, or None when the server answers 404 (the route does not exist).
- ``tokenize(text)``: token ids from ``/v1/tokenize`` (which a kvroute gateway passes through), else
  ``/tokenize``; None when neither exists.
- ``generate(body)``: one streamed ``/generate`` request. TTFT = seconds from just before the request is
  sent (the body is encoded beforehand) to the first event that carries output (``output_ids`` or
  ``text`` non-empty): the first content byte. The last event's ``meta_info`` gives ``prompt_tokens``,
  ``cached_tokens`` and, when the server reports them, ``cached_tokens_details {device, host[, storage]}``.
  A kvroute gateway adds the ``x-kvroute-replica`` header: the replica that served the request.
- ``flush_cache(timeout_s)``: ``POST /flush_cache``; SGLang answers 400 while requests run, so a refusal
  is retried with ``?timeout=T`` (the server then waits up to T s for idleness), every second until T
  seconds have passed.

Every failure becomes one ``DiagError`` with a one-line message naming the URL and the cause; prompt
text never appears in it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

REPLICA_HEADER = "x-kvroute-replica"
JSON_HEADERS = {"Content-Type": "application/json"}


class DiagError(Exception):
    """A diagnostic cannot go on; ``str(err)`` is the one-line message for the user."""


class Unreachable(DiagError):
    """No connection could be made (refused, DNS, connect timeout)."""


class Unauthorized(DiagError):
    """The server wants an API key, or refused the one given (HTTP 401/403)."""


@dataclass(frozen=True, slots=True)
class Generation:
    """What one streamed /generate request measured and reported (token counts None when absent)."""

    ttft_s: float
    total_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    device: int | None
    host: int | None
    storage: int | None
    replica: str | None


def check_url(url: str) -> str:
    """The base URL without a trailing slash; raises DiagError unless it is http(s)://host[:port]."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise DiagError(f"{url!r} is not an http:// or https:// URL")
    try:
        _ = parts.port
    except ValueError:
        raise DiagError(f"{url!r} has an invalid port") from None
    return url.rstrip("/")


def error_text(body: bytes) -> str:
    """The message of an SGLang/OpenAI/FastAPI error body, else its first line (at most 200 chars)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        inner = doc.get("error")
        for holder in (inner, doc):
            if isinstance(holder, dict) and isinstance(holder.get("message"), str):
                return str(holder["message"])[:200]
        if isinstance(doc.get("detail"), str):
            return str(doc["detail"])[:200]
    lines = body.decode(errors="replace").strip().splitlines()
    return (lines[0] if lines else "(empty body)")[:200]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def generation(ttft: float, total: float, meta: dict[str, Any], replica: str | None) -> Generation:
    details = meta.get("cached_tokens_details")
    tiers = details if isinstance(details, dict) else {}
    cached = _int(meta.get("cached_tokens"))
    device, host = _int(tiers.get("device")), _int(tiers.get("host"))
    if cached == 0 and not tiers:  # SGLang omits the details when nothing was cached
        device = host = 0
    return Generation(
        ttft,
        total,
        _int(meta.get("prompt_tokens")),
        cached,
        device,
        host,
        _int(tiers.get("storage")),
        replica,
    )


STATUS_PATHS = ("/status", "/metrics")


class SGLangClient:
    """One ClientSession against one base URL (other bases, e.g. a gateway's replicas, per call)."""

    def __init__(
        self, url: str, timeout_s: float = 900.0, api_key: str | None = None, status_key: str | None = None
    ) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        # the key goes to this URL only, never to the replicas a gateway lists
        self._headers = JSON_HEADERS | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
        # a kvroute gateway's /status and /metrics may need its status (or admin) key instead
        self._status = (
            JSON_HEADERS | {"Authorization": f"Bearer {status_key}"} if status_key else self._headers
        )

    def _headers_for(self, path: str, base: str | None) -> dict[str, str]:
        if base not in (None, self.url):
            return JSON_HEADERS
        return self._status if path.split("?")[0] in STATUS_PATHS else self._headers

    async def __aenter__(self) -> SGLangClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("SGLangClient used outside `async with`")
        return self._session

    async def request(
        self, method: str, path: str, body: bytes | None = None, base: str | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; connection problems and timeouts raise DiagError."""
        url = (base or self.url) + path
        try:
            headers = self._headers_for(path, base)
            async with self.session.request(method, url, data=body, headers=headers) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientConnectorError as e:
            raise Unreachable(f"cannot connect to {base or self.url}: {e.os_error.strerror or e}") from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise DiagError(f"{method} {url} failed: {type(e).__name__} {e}".rstrip()) from None

    async def get_json(self, path: str, base: str | None = None) -> Any:
        """The JSON body of ``GET path``; None on 404; DiagError on another status or on non-JSON."""
        status, body = await self.request("GET", path, base=base)
        if status == 404:
            return None
        if status in {401, 403}:
            sent = "Authorization" in self._headers_for(path, base)
            flag = "--api-key"
            if path in STATUS_PATHS:
                flag = "--api-key (an SGLang server's key) or --status-key (a kvroute gateway's)"
            advice = f"pass {flag}" if not sent else "the API key was refused"
            raise Unauthorized(f"GET {base or self.url}{path} returned HTTP {status}: {advice}")
        if status != 200:
            raise DiagError(f"GET {base or self.url}{path} returned HTTP {status}: {error_text(body)}")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise DiagError(f"GET {base or self.url}{path} did not return JSON") from None

    async def get_text(self, path: str, base: str | None = None) -> str | None:
        """The body of ``GET path`` as text, or None unless it answered 200 (e.g. /metrics is off)."""
        try:
            status, body = await self.request("GET", path, base=base)
        except DiagError:
            return None
        return body.decode(errors="replace") if status == 200 else None

    async def tokenize(self, text: str) -> list[int] | None:
        payload = orjson.dumps({"prompt": text, "add_special_tokens": False})
        for path in ("/v1/tokenize", "/tokenize"):
            status, body = await self.request("POST", path, payload)
            tokens = _json_field(body, "tokens") if status == 200 else None
            if isinstance(tokens, list) and tokens and all(_int(t) is not None for t in tokens):
                return tokens
        return None

    async def generate(self, body: bytes, headers: dict[str, str] | None = None) -> Generation:
        """One streamed /generate request (``body`` already has ``"stream": true``)."""
        try:
            return await self._stream(body, self._headers | (headers or {}))
        except aiohttp.ClientConnectorError as e:
            raise Unreachable(f"cannot connect to {self.url}: {e.os_error.strerror or e}") from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise DiagError(f"POST {self.url}/generate failed: {type(e).__name__} {e}".rstrip()) from None

    async def _stream(self, body: bytes, headers: dict[str, str]) -> Generation:
        start = time.perf_counter()
        first: float | None = None
        meta: dict[str, Any] = {}
        async with self.session.post(self.url + "/generate", data=body, headers=headers) as resp:
            if resp.status != 200:
                raise DiagError(
                    f"POST {self.url}/generate returned HTTP {resp.status}: {error_text(await resp.read())}"
                )
            replica = resp.headers.get(REPLICA_HEADER)
            async for raw in resp.content:
                event = _event(raw)
                if event is None:
                    continue
                if first is None and (event.get("output_ids") or event.get("text")):
                    first = time.perf_counter() - start
                meta = event.get("meta_info") or meta
        total = time.perf_counter() - start
        if not meta:
            raise DiagError(f"POST {self.url}/generate streamed no SGLang events (is this SGLang?)")
        return generation(first if first is not None else total, total, meta, replica)

    async def flush_cache(self, timeout_s: float) -> None:
        """Flushes the radix cache and the host pool; DiagError if the server stays busy for ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        status, body = await self.request("POST", "/flush_cache")
        while not 200 <= status < 300:
            if status not in {400, 502} or time.monotonic() >= deadline:
                raise DiagError(f"POST {self.url}/flush_cache returned HTTP {status}: {error_text(body)}")
            remaining = deadline - time.monotonic()
            status, body = await self.request("POST", f"/flush_cache?timeout={remaining:.1f}")
            if not 200 <= status < 300:  # a server that does not wait: poll once a second
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _json_field(body: bytes, key: str) -> Any:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc.get(key) if isinstance(doc, dict) else None


def _event(raw: bytes) -> dict[str, Any] | None:
    """The JSON object of one SSE ``data:`` line; raises DiagError for an in-band error event."""
    line = raw.strip()
    if not line.startswith(b"data:") or line == b"data: [DONE]":
        return None
    try:
        event = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    if "error" in event:
        err = event["error"]
        message = err.get("message") if isinstance(err, dict) else err
        raise DiagError(f"the server failed the request mid-stream: {message}")
    return event
