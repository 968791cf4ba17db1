"""The Redis implementation of ``proxy.sync.state_store.StateStore`` (layout in that module's docstring).

One client (redis-py's asyncio ``Redis``, ``RedisCluster`` or a Sentinel master), short timeouts: a slow or
absent Redis must fail a sync round quickly, never a request (the sync task runs beside the request path and
keeps the last known view). Writes are pipelined: a publish is one round trip (XADD with MAXLEN ~ and EXPIRE,
a SET PX per document, ZADD of the gateway's heartbeat, a trim of gateways silent for GATEWAY_TTL_S, EXPIRE,
and in a round without events, a pulse: XADD to the short stream ``kvroute:{NS}:pulse``); a gather is two
(ZRANGEBYSCORE, then one MGET). A read blocks on the log and the pulse stream in one XREAD, so a round of
another gateway that changed only its documents (a request's first token, its end) wakes this gateway's reader
at once, which then gathers them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from proxy.sync.local_store import LocalStore
from proxy.sync.local_wire import SCHEME
from proxy.sync.state_store import (
    GATEWAY_TTL_S,
    LOG_MAX,
    LOG_TTL_S,
    Batch,
    Doc,
    MemoryStore,
    StateStore,
    decode,
    encode,
)
from routing.sharing import Event

TIMEOUT_S = 1.0
READ_COUNT = 2000  # batches per read
PULSE_MAX = 256  # pulses kept: one per publishing round, only to wake the other gateways' readers


def connect(url: str) -> Any:
    """A client for ``url``: redis://, rediss://, unix://, redis+cluster://, redis+sentinel://."""
    parts = urlsplit(url)
    opts: dict[str, Any] = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": TIMEOUT_S}
    if parts.scheme == "redis+cluster":
        return RedisCluster.from_url(url.replace("redis+cluster://", "redis://", 1), **opts)
    if parts.scheme == "redis+sentinel":
        hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in parts.netloc.split(",")]
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError("redis+sentinel:// needs a service name: redis+sentinel://HOST:PORT/SERVICE")
        db = int(path[1]) if len(path) > 1 else 0
        master_for: Callable[..., Any] = Sentinel(hosts, **opts).master_for  # typed from redis 8 on only
        return master_for(path[0], db=db, **opts)
    return aioredis.Redis.from_url(url, **opts)


class RedisStore:
    name = "redis"

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self._client = connect(url)
        tag = "{" + namespace + "}"
        self.log_key = f"kvroute:{tag}:events"
        self.gateways_key = f"kvroute:{tag}:gateways"
        self._doc_prefix = f"kvroute:{tag}:doc:"
        self.pulse_key = f"kvroute:{tag}:pulse"
        self._pulse_at = "0-0"  # the pulses read so far
        self._me = ""  # the gateway that publishes through this store (its own pulses are skipped)

    async def publish(
        self, gateway: str, events: Sequence[Event], docs: Mapping[str, Doc], pulse: bool = True
    ) -> None:
        now = time.time()
        self._me = gateway
        pipe = self._client.pipeline(transaction=False)
        if pulse and not events:  # events wake the readers themselves
            pipe.xadd(self.pulse_key, {"g": gateway}, maxlen=PULSE_MAX, approximate=True)
            pipe.expire(self.pulse_key, LOG_TTL_S)
        if events:
            entry = {"g": gateway, "p": encode(Batch(gateway, tuple(events)))}
            pipe.xadd(self.log_key, entry, maxlen=LOG_MAX, approximate=True)
            pipe.expire(self.log_key, LOG_TTL_S)
        for kind, doc in docs.items():
            pipe.set(f"{self._doc_prefix}{kind}:{gateway}", doc.data, px=max(1, int(doc.ttl_s * 1000)))
        pipe.zadd(self.gateways_key, {gateway: now})
        pipe.zremrangebyscore(self.gateways_key, 0, now - GATEWAY_TTL_S)
        pipe.expire(self.gateways_key, LOG_TTL_S)
        await pipe.execute()

    async def read(self, since: str, block_s: float = 0.0) -> tuple[list[tuple[str, Batch]], str]:
        """Blocks on the log and the pulse stream at once. Another gateway's pulse (a round without
        events: its documents changed) comes back as an empty batch of that gateway and ends the wait;
        this gateway's own pulses do not. The position returned is the log's."""
        deadline = time.monotonic() + min(block_s, TIMEOUT_S / 2)
        while True:
            # XREAD BLOCK in ms (0 would be forever), within the socket time-out
            left = deadline - time.monotonic()
            block = max(1, int(left * 1000)) if block_s > 0 else None
            streams = {self.log_key: since, self.pulse_key: self._pulse_at}
            found = dict(await self._client.xread(streams, count=READ_COUNT, block=block) or ())
            log = [
                (_text(i), decode(f[b"p"] if b"p" in f else f["p"])) for i, f in _entries(found, self.log_key)
            ]
            position = log[-1][0] if log else since
            out = log + [(position, Batch(g, ())) for g in self._pulsed(_entries(found, self.pulse_key))]
            if out or block is None or left <= 0.001:
                return out, position

    def _pulsed(self, entries: list[tuple[Any, Any]]) -> list[str]:
        """Moves the pulse position past ``entries``; the other gateways among them."""
        if entries:
            self._pulse_at = _text(entries[-1][0])
        gateways = {_text(f.get(b"g", f.get("g", b""))) for _, f in entries}
        return sorted(gateways - {self._me})

    async def gather(self, kinds: Sequence[str], skip: str) -> dict[str, dict[str, Any]]:
        alive = await self._client.zrangebyscore(self.gateways_key, time.time() - GATEWAY_TTL_S, "+inf")
        others = [g for g in map(_text, alive) if g != skip]
        out: dict[str, dict[str, Any]] = {k: {} for k in kinds}
        pairs = [(k, g) for k in kinds for g in others]
        if not pairs:
            return out
        values = await self._client.mget([f"{self._doc_prefix}{k}:{g}" for k, g in pairs])
        for (kind, g), value in zip(pairs, values, strict=True):
            if value is not None:
                out[kind][g] = orjson.loads(value)
        return out

    async def leave(self, gateway: str, kinds: Sequence[str]) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.zrem(self.gateways_key, gateway)
        for kind in kinds:
            pipe.delete(f"{self._doc_prefix}{kind}:{gateway}")
        await pipe.execute()

    async def close(self) -> None:
        await self._client.aclose()


def _entries(found: dict[Any, Any], key: str) -> list[tuple[Any, Any]]:
    """The entries XREAD returned for one stream (keys come back as bytes or str)."""
    return list(found.get(key.encode(), found.get(key, ())))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def store_from_url(url: str, namespace: str) -> StateStore:
    """``memory``, a Redis URL (see the module docstring) or the ``--workers`` supervisor's local channel
    (``kvroute+unix://``, ``proxy/sync/local_wire.py``); ValueError for anything else."""
    if url == "memory":
        return MemoryStore()
    scheme = urlsplit(url).scheme
    if scheme == SCHEME:
        return LocalStore(url)
    if scheme not in ("redis", "rediss", "redis+cluster", "redis+sentinel", "unix"):
        raise ValueError(f"expected memory or a redis:// URL, got {url!r}")
    return RedisStore(url, namespace)
