"""The one place where the gateway talks to replicas, and where aiohttp client errors become
``UpstreamError``.

One shared ``ClientSession`` per gateway: its ``TCPConnector`` keeps a keep-alive pool per replica
(host:port), sets TCP_NODELAY on every connection (aiohttp does it in ``connection_made``; we also do it
explicitly when a response arrives, so no Nagle/delayed-ACK stall can appear on streamed bodies) and
never decompresses (``auto_decompress=False``), so relayed bytes are the replica's bytes.

Error classification (what the handler may retry on another replica):
- connection refused, DNS failure, connect timeout: ``UpstreamUnavailable(retryable=True,
  unreachable=True)`` (the fleet takes the replica out until its next good health check);
- the connection reset/closed before any response byte (a replica restarting, or a stale keep-alive
  connection): ``UpstreamUnavailable(retryable=True)``;
- no first byte by the request's first-byte deadline (``proxy/upstream/deadlines.py``; the response headers
  and, for a stream, its first chunk): ``UpstreamTimeout(retryable=True)`` (the caller aborts it on the
  replica and retries elsewhere, nothing having reached the client);
- a failure while reading a whole body or a stream's first chunk: ``UpstreamUnavailable(retryable=True)``;
- a stream idle for ``idle_s`` after its first chunk: ``UpstreamTimeout``; a connection failing after
  it: ``UpstreamUnavailable(retryable=False)`` (the client already has bytes).

Deadlines are loop times (``asyncio.timeout_at``), not aiohttp's ``sock_read``: one socket read timeout
cannot tell a long prefill from an idle stream. A first-byte deadline waits on while the replica is
working, i.e. sent body bytes to any request within the liveness window (``proxy/upstream/liveness.py``), and
the request is not stuck, up to the cap of its ``FirstByteWait`` (the attempt's start + ``request_timeout``):
a busy replica's queued request is not aborted and moved.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream.liveness import FirstByteWait, Liveness, PatientTimeout

log = logging.getLogger("kvroute.upstream")
ABORT_TIMEOUT_S = 2.0


class Upstream:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        connect_timeout: float,
        liveness: Liveness | None = None,
        on_extend: Callable[[str], None] | None = None,
        authorization: Callable[[str], str | None] | None = None,
    ) -> None:
        self.session = session
        self._authorization = (
            authorization  # the gateway's credential per replica (proxy/upstream/credentials.py)
        )
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=None
        )
        self.liveness = liveness or Liveness(5.0)
        self._on_extend = on_extend  # told the replica id of each first-byte wait that went on

    def _first_byte(self, replica: str, wait: FirstByteWait) -> PatientTimeout:
        """The wait for a first byte: past its deadline only while the replica is working and the request
        is not stuck, never past its cap."""
        tell, live = self._on_extend, self.liveness
        extended = None if tell is None else (lambda: tell(replica))
        return PatientTimeout(
            wait.deadline, wait.cap, lambda: None if wait.stuck() else live.working_until(replica), extended
        )

    def _headers(self, base_url: str, headers: Mapping[str, str]) -> Mapping[str, str]:
        """``headers`` with the gateway's own ``Authorization`` for the replica, when it has one."""
        auth = self._authorization(base_url) if self._authorization is not None else None
        if auth is None:
            return headers
        out = CIMultiDict(headers)
        out["Authorization"] = auth
        return out

    @staticmethod
    def new_session(max_connections: int = 0) -> aiohttp.ClientSession:
        # idle connections are closed after 4 s, before uvicorn (SGLang's server) drops them at 5 s, so a
        # request rarely meets a connection the replica is closing
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=4.0)
        return aiohttp.ClientSession(  # no cookie jar: one answer's Set-Cookie is not another's Cookie
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def send(
        self,
        base_url: str,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes | None,
        wait: FirstByteWait,
    ) -> aiohttp.ClientResponse:
        """Sends one request; returns the response once its headers arrived (any status), by ``wait``'s
        deadline (or later, while the replica works)."""
        try:
            async with self._first_byte(base_url, wait):
                resp = await self.session.request(
                    method,
                    URL(
                        base_url + path_qs, encoded=True
                    ),  # never re-normalized (proxy/front/request_guard.py)
                    headers=self._headers(base_url, headers),
                    data=body,
                    timeout=self._timeout,
                    allow_redirects=False,
                )
        except aiohttp.ClientConnectorError as e:
            msg = f"replica {base_url} unreachable ({unreachable_why(e)})"
            raise UpstreamUnavailable(msg, retryable=True, unreachable=True) from e
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:  # e.g. a stale keep-alive
            raise UpstreamUnavailable(f"replica {base_url} closed: {type(e).__name__}", retryable=True) from e
        except aiohttp.ConnectionTimeoutError as e:
            msg = f"replica {base_url}: connect timeout"
            raise UpstreamUnavailable(msg, retryable=True, unreachable=True) from e
        except TimeoutError as e:
            raise UpstreamTimeout(f"replica {base_url}: no first byte in time", retryable=True) from e
        except aiohttp.ClientError as e:
            raise UpstreamUnavailable(f"replica {base_url}: {type(e).__name__}: {e}", retryable=False) from e
        return resp

    async def next_chunk(
        self, resp: aiohttp.ClientResponse, replica: str, until: float | FirstByteWait
    ) -> bytes:
        """The next piece of ``replica``'s body as it arrives (b"" at its end): by the loop time ``until``,
        or, for the first one, by ``until``'s first-byte wait (nothing of the body reached the client yet,
        so a failure is retryable)."""
        first = isinstance(until, FirstByteWait)
        try:
            if isinstance(until, FirstByteWait):  # (``first``, narrowed for the type checker)
                async with self._first_byte(replica, until):
                    chunk = await resp.content.readany()
            else:
                async with asyncio.timeout_at(until):
                    chunk = await resp.content.readany()
            if chunk:
                self.liveness.beat(replica, asyncio.get_running_loop().time())
            return chunk
        except TimeoutError as e:
            what = "no first byte in time" if first else "stream idle too long"
            raise UpstreamTimeout(f"replica {resp.url.origin()}: {what}", retryable=first) from e
        except (aiohttp.ClientError, OSError) as e:  # OSError: a reset aiohttp did not wrap
            raise UpstreamUnavailable(
                f"replica connection failed mid-response: {type(e).__name__}", retryable=first
            ) from e

    async def chunks(self, resp: aiohttp.ClientResponse, replica: str, idle_s: float) -> AsyncIterator[bytes]:
        """The rest of ``replica``'s streamed body, each chunk within ``idle_s`` of the previous one."""
        loop = asyncio.get_running_loop()
        while chunk := await self.next_chunk(resp, replica, loop.time() + idle_s):
            yield chunk

    async def read(self, resp: aiohttp.ClientResponse, replica: str, wait: FirstByteWait) -> bytes:
        """``replica``'s whole body, by ``wait``'s deadline, waiting on while the replica works (nothing of
        it reached the client: retryable)."""
        try:
            async with self._first_byte(replica, wait):
                body = await resp.read()
            self.liveness.beat(replica, asyncio.get_running_loop().time())
            return body
        except TimeoutError as e:
            raise UpstreamTimeout(f"replica {resp.url.origin()}: no answer in time", retryable=True) from e
        except (aiohttp.ClientError, OSError) as e:  # OSError: a reset aiohttp did not wrap
            raise UpstreamUnavailable(
                f"replica connection failed mid-response: {type(e).__name__}", retryable=True
            ) from e

    async def call(
        self,
        base_url: str,
        method: str,
        path: str,
        timeout_s: float,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, bytes]:
        """A small control-plane call (health, info, abort, a warm-up step): (status, body); ``json`` or
        ``data`` (JSON bytes) is the body; raises UpstreamError."""
        data = orjson.dumps(json) if json is not None else data
        hdrs = dict(self._headers(base_url, headers or {}))
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            async with self.session.request(
                method,
                base_url + path,
                data=data,
                headers=hdrs,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise UpstreamTimeout(f"replica {base_url}{path}: timeout") from e
        except aiohttp.ClientConnectorError as e:
            msg = f"replica {base_url}{path}: unreachable ({unreachable_why(e)})"
            raise UpstreamUnavailable(msg, retryable=True) from e
        except aiohttp.ClientError as e:
            raise UpstreamUnavailable(f"replica {base_url}{path}: {type(e).__name__}", retryable=True) from e

    async def abort(self, base_url: str, rid: str) -> None:
        """``POST /abort_request {"rid"}`` (contract §1.1); a failure is logged, never raised."""
        try:
            await self.call(base_url, "POST", "/abort_request", ABORT_TIMEOUT_S, json={"rid": rid})
        except UpstreamError as e:
            log.info("abort of %s on %s failed: %s", rid, base_url, e.message)

    async def get_json(self, base_url: str, path: str, timeout_s: float) -> Any:
        status, body = await self.call(base_url, "GET", path, timeout_s)
        if status != 200:
            raise UpstreamError(f"replica {base_url}{path}: HTTP {status}")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise UpstreamError(f"replica {base_url}{path}: invalid JSON") from e


def unreachable_why(e: aiohttp.ClientConnectorError) -> str:
    """Why a connection failed, in words an operator reads (the OS error's class otherwise)."""
    os_error = e.os_error
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(os_error, socket.gaierror):
        return f"name not resolved: {os_error.strerror}"
    return type(os_error).__name__
