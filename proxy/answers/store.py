"""Where the response cache keeps its answers: in this process, or in Redis shared by gateways.

Keys are ``kvroute:<tenant>:resp:<request>`` (``store_key``): two hex digests (16 and 64 digits), never
prompt text. Values are the stored answer's JSON (``proxy.answers.answer.Answer.to_json``): the
model's output, never the prompt. Every entry lives ``ttl_s`` seconds from its write (a hit does not
extend it), and no single value larger than ``max_bytes`` is stored.

``MemoryStore``: an LRU (an ordered dict, the least recently used first) bounded by ``max_entries`` and
``max_bytes``, where an entry weighs ``len(key) + len(value)`` bytes. A write evicts from the LRU end
until both bounds hold; an expired entry is dropped when it is read or reaches the LRU end.

``RedisStore``: ``GET`` and ``SET key value PX ttl``, each bounded by ``timeout_s``. Redis bounds its
own memory (its ``maxmemory`` and eviction policy). When a call fails (refused, timed out, any Redis
error) the cache is skipped: a read is a miss and a write is dropped, never an error for the client.
The first failure of an outage is logged once (a warning), and so is the recovery; while it is down
one call per ``retry_s`` probes Redis and every other call skips it at once. A ``strict`` store (the
Responses state, ``proxy/responses/state.py``, for which a miss would be a wrong answer) raises
``StoreUnavailable`` instead of skipping; it may be given its own client (a cluster or a Sentinel master).

Both also delete a key and read several at once (``get_many``), renewing the time to live of the keys
named in ``renew`` (it counts again from now) in the same round trip: for stores whose entries are linked
(a chain of responses, renewed whenever it is continued).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.config.urls import redacted_url

log = logging.getLogger("kvroute.response_cache")
REDIS_TIMEOUT_S = 0.25
REDIS_RETRY_S = 1.0


class StoreUnavailable(Exception):
    """A strict store could not be reached (the message names where, never a key)."""


def store_key(tenant: str, request: str) -> str:
    return f"kvroute:{tenant}:resp:{request}"


class Store(Protocol):
    name: str

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> bool: ...  # True when written

    async def delete(self, key: str) -> bool: ...  # True when it was there

    async def get_many(self, keys: list[str], renew: Sequence[str] = ()) -> list[bytes | None]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """The in-process LRU with a TTL (see the module docstring)."""

    name = "memory"

    def __init__(
        self, ttl_s: float, max_bytes: int, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.max_bytes, self.max_entries, self._clock = ttl_s, max_bytes, max_entries, clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if self._clock() >= found[0]:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return found[1]

    async def get_many(self, keys: list[str], renew: Sequence[str] = ()) -> list[bytes | None]:
        found = [await self.get(k) for k in keys]
        expires = self._clock() + self.ttl_s
        for key in renew:
            if await self.get(key) is not None:
                self._entries[key] = (expires, self._entries[key][1])
        return found

    async def delete(self, key: str) -> bool:
        return self._drop(key)

    async def put(self, key: str, value: bytes) -> bool:
        if len(key) + len(value) > self.max_bytes:
            return False
        self._drop(key)
        self._entries[key] = (self._clock() + self.ttl_s, value)
        self.bytes += len(key) + len(value)
        self._evict()
        return True

    def _evict(self) -> None:
        now = self._clock()
        while self._entries:
            key, (expires, _) = next(iter(self._entries.items()))
            full = len(self._entries) > self.max_entries or self.bytes > self.max_bytes
            if not full and expires > now:
                return
            self._drop(key)

    def _drop(self, key: str) -> bool:
        found = self._entries.pop(key, None)
        if found is not None:
            self.bytes -= len(key) + len(found[1])
        return found is not None

    async def close(self) -> None:
        self._entries.clear()
        self.bytes = 0


class RedisStore:
    """Redis behind a breaker: a failure skips the cache, never fails the request (unless ``strict``)."""

    name = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: float,
        max_bytes: int,
        timeout_s: float = REDIS_TIMEOUT_S,
        retry_s: float = REDIS_RETRY_S,
        client: Any = None,
        strict: bool = False,
    ) -> None:
        self.where, self.max_bytes, self.timeout_s, self.retry_s = (
            redacted_url(url),
            max_bytes,
            timeout_s,
            retry_s,
        )
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._client = client or aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self.strict = strict
        self.down = False
        self._probe_at = 0.0

    async def get(self, key: str) -> bytes | None:
        found = await self._call(lambda c: c.get(key))
        return found if isinstance(found, bytes) else None

    async def put(self, key: str, value: bytes) -> bool:
        if len(key) + len(value) > self.max_bytes:
            return False
        return await self._call(lambda c: c.set(key, value, px=self._ttl_ms)) is True

    async def delete(self, key: str) -> bool:
        return bool(await self._call(lambda c: c.delete(key)))

    async def get_many(self, keys: list[str], renew: Sequence[str] = ()) -> list[bytes | None]:
        async def read(c: aioredis.Redis) -> Any:
            pipe = c.pipeline(transaction=False)
            if keys:
                pipe.mget(keys)
            for key in renew:
                pipe.pexpire(key, self._ttl_ms)
            return await pipe.execute()

        done = await self._call(read) if keys or renew else None
        found = done[0] if done and keys else [None] * len(keys)
        return [v if isinstance(v, bytes) else None for v in found]

    async def _call(self, op: Callable[[aioredis.Redis], Awaitable[Any]]) -> Any:
        now = time.monotonic()
        if self.down:
            if now < self._probe_at:
                return self._skipped(None)
            self._probe_at = now + self.retry_s  # this call probes; the others keep skipping
        try:
            result = await asyncio.wait_for(op(self._client), self.timeout_s)
        except (RedisError, OSError, TimeoutError) as e:
            if not self.down:
                log.warning("%s: Redis at %s is unavailable (%s)", self._what, self.where, e)
            self.down, self._probe_at = True, now + self.retry_s
            return self._skipped(e)
        if self.down:
            log.warning("%s: Redis at %s answers again", self._what, self.where)
            self.down = False
        return result

    @property
    def _what(self) -> str:
        return "responses state" if self.strict else "response cache (serving uncached meanwhile)"

    def _skipped(self, error: Exception | None) -> None:
        """A call that did not reach Redis: None (a miss, a dropped write), or raised when strict."""
        if self.strict:
            raise StoreUnavailable(f"the state store (Redis at {self.where}) is unavailable") from error

    async def close(self) -> None:
        await self._client.aclose()
