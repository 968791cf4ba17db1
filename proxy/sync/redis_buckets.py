"""The shared rate-limit buckets in Redis (``proxy/tenancy/shared_limits.py`` leases from them).

One hash per bucket, ``kvroute:{NS}:limit:{BUCKET}`` (``BUCKET``: a hash of the tenant or key and the
kind, never a name), fields ``l`` (the level) and ``t`` (when it was last written, Redis' own clock: the
gateways' clocks never meet). Each operation is one Lua script, so it is atomic however many gateways
ask at once: ``TAKE`` refills the bucket (``per_minute / 60`` per second, up to ``per_minute``) and
takes from ``need`` up to ``want`` when ``need`` fits (or the bucket is full: a request larger than a
minute's allowance passes alone), else answers the seconds until it would; ``GIVE`` puts back what a
lease did not spend (or takes a debt). A missing hash is a full bucket; each one expires when it would
be full again, so idle tenants cost no memory. Levels travel as strings (Lua turns numbers into integer
replies).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from proxy.sync.local_store import LocalStore
from proxy.sync.local_wire import SCHEME
from proxy.sync.redis_store import connect

_REFILL = """
local pm = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'l', 't')
local level = tonumber(s[1]) or pm
local at = tonumber(s[2]) or now
level = math.min(pm, level + math.max(0, now - at) * pm / 60)
"""
_KEEP = """
redis.call('HSET', KEYS[1], 'l', tostring(level), 't', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((pm - level) * 60000 / pm) + 1000)
"""
TAKE = (
    _REFILL
    + """
local need, want = tonumber(ARGV[2]), tonumber(ARGV[3])
local floor = math.min(need, pm)
if level < floor then
  return {'0', tostring((floor - level) * 60 / pm)}
end
local granted = need
if need < level then granted = math.min(math.max(want, need), level) end
level = level - granted
"""
    + _KEEP
    + "return {tostring(granted), '0'}"
)
GIVE = (
    _REFILL
    + """
level = math.min(pm, level + tonumber(ARGV[2]))
"""
    + _KEEP
    + "return tostring(level)"
)


class RedisBuckets:
    """``proxy.tenancy.shared_limits.BucketStore`` on Redis (its own client: the request path's calls
    do not queue behind the state sync's blocking reads)."""

    name = "redis"

    def __init__(self, url: str, namespace: str) -> None:
        self._client = connect(url)
        self._prefix = "kvroute:{" + namespace + "}:limit:"
        self._take: Any = self._client.register_script(TAKE)
        self._give: Any = self._client.register_script(GIVE)

    async def take(self, bucket: str, per_minute: int, need: float, want: float) -> tuple[float, float]:
        granted, wait = await self._take(keys=[self._prefix + bucket], args=[per_minute, need, want])
        return float(granted), float(wait)

    async def give(self, bucket: str, per_minute: int, amount: float) -> None:
        await self._give(keys=[self._prefix + bucket], args=[per_minute, amount])

    async def close(self) -> None:
        await self._client.aclose()


def shared_buckets(url: str | None, namespace: str) -> RedisBuckets | LocalStore | None:
    """The buckets of a ``--state`` URL: in Redis, or in the supervisor's local channel; None for none
    (or ``memory``: one gateway process alone keeps its own)."""
    if url is None or url == "memory":
        return None
    if urlsplit(url).scheme == SCHEME:
        return LocalStore(url)
    return RedisBuckets(url, namespace)
