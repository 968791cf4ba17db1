"""Rate limits that hold per deployment: one bucket per tenant in a shared store, spent from local leases.

Each bucket of ``proxy/tenancy/rate_limit.py`` (a tenant's, or a tenant-less key's; requests or tokens
per minute) lives once in the state store (``BucketStore``: Redis, ``proxy/sync/redis_buckets.py``, or
the supervisor's local channel of ``--workers``, ``proxy/sync/local_hub.py``), with the same rule as the
local buckets: up to one minute's allowance, refilled continuously, a request larger than a whole
minute's allowance passes alone from a full bucket. A gateway does not ask the store for every request:
it **leases** a batch from the shared bucket (one atomic ``take``: what the request needs, plus up to
``LEASE_S`` seconds of the bucket's refill) and admits the next requests locally from that lease, with
no round trip. Leased tokens are spent for good: whatever leases the gateways hold, the requests they
admit never outnumber what left the shared bucket, so a tenant limited to N requests a minute gets at
most N (plus the refill while it asks) through any number of gateways and worker processes. A lease
unused for ``LEASE_TTL_S`` goes back to the bucket (``sweep``, run in the background; all of them when
the gateway stops), so an idle gateway does not sit on a tenant's allowance. Token charges are settled
on the lease (the difference between the estimate and the usage; a debt goes back as a debit).

When the store is refused, times out (``timeout_s``, 0.25 s: the request path never waits longer) or
fails, the store is skipped for ``retry_s`` (one request then probes it) and ``when_down`` decides:
``open`` (the default) admits on this process's own buckets (the limits hold per process for as long
as the outage lasts), ``closed`` answers 503 ``rate_limits_unavailable`` to the requests of limited
keys. Unlimited keys never touch the store. A refusal is remembered for up to ``REFUSAL_HOLD_S`` (a
burst past the limit costs the store one call, not one per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from proxy.errors import LimitsUnavailable, RateLimited
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.rate_limit import Bucket, RateLimiter

log = logging.getLogger("kvroute.limits")
T = TypeVar("T")
LEASE_S = 0.5  # a lease takes up to this many seconds of the bucket's refill beyond what it needs
LEASE_TTL_S = 1.0  # what a lease did not spend in this long goes back to the bucket
TIMEOUT_S = 0.25
RETRY_S = 1.0
REFUSAL_HOLD_S = 0.25
WhenDown = Literal["open", "closed"]


class BucketStore(Protocol):
    """The shared buckets (every call may raise: the limiter takes that for a store that is down)."""

    name: str

    async def take(self, bucket: str, per_minute: int, need: float, want: float) -> tuple[float, float]:
        """Refills the bucket, then takes from ``need`` up to ``want`` from it: (granted, 0.0), or
        (0.0, seconds until ``need`` fits) and nothing taken."""
        ...

    async def give(self, bucket: str, per_minute: int, amount: float) -> None:
        """Puts ``amount`` back (negative: takes it), up to a full bucket."""
        ...

    async def close(self) -> None: ...


def take_from(b: Bucket, need: float, want: float) -> tuple[float, float]:
    """``BucketStore.take`` on one refilled bucket (the rule the Redis script repeats)."""
    wait = b.wait_s(need)
    if wait > 0:
        return 0.0, wait
    granted = need if need >= b.level else min(max(want, need), b.level)
    b.level -= granted
    return granted, 0.0


class MemoryBuckets:
    """Buckets in this process: the store the ``--workers`` supervisor serves its workers."""

    name = "memory"

    def __init__(self) -> None:
        self._buckets: dict[str, Bucket] = {}

    def _bucket(self, bucket: str, per_minute: int) -> Bucket:
        now = time.monotonic()
        b = self._buckets.get(bucket)
        if b is None:
            b = self._buckets[bucket] = Bucket(per_minute, float(per_minute), now)
        b.per_minute = per_minute
        b.refill(now)
        return b

    async def take(self, bucket: str, per_minute: int, need: float, want: float) -> tuple[float, float]:
        return take_from(self._bucket(bucket, per_minute), need, want)

    async def give(self, bucket: str, per_minute: int, amount: float) -> None:
        b = self._bucket(bucket, per_minute)
        b.level = min(float(per_minute), b.level + amount)

    async def close(self) -> None:
        self._buckets.clear()


@dataclass(slots=True)
class Lease:
    """What this process holds of one shared bucket."""

    bucket: str  # its name in the store: a hash, never the tenant's name
    per_minute: int
    level: float = 0.0
    taken_s: float = 0.0  # when it last took from the store (or was settled)
    refused_until_s: float = 0.0
    full_at_s: float = 0.0  # when the last refusal said the cost would fit


def store_bucket(key: ApiKey, kind: str) -> str:
    return hashlib.sha256(f"{key.bucket}\x00{kind}".encode("utf-8", "surrogatepass")).hexdigest()[:32]


class StoreDown(Exception):
    """The store did not answer: the limiter falls back (``when_down``)."""


class SharedLimiter(RateLimiter):
    """The limits through a ``BucketStore`` (the module docstring); ``RateLimiter``'s buckets are the
    fallback of ``when_down`` ``open``."""

    def __init__(
        self,
        store: BucketStore,
        when_down: WhenDown = "open",
        timeout_s: float = TIMEOUT_S,
        retry_s: float = RETRY_S,
    ) -> None:
        super().__init__()
        self.store, self.when_down, self.timeout_s, self.retry_s = store, when_down, timeout_s, retry_s
        self._leases: dict[tuple[str, str], Lease] = {}
        self.down = False
        self._skip_until_s = 0.0
        self.store_calls = 0
        self.fallbacks = 0

    async def charge(self, key: ApiKey, tokens: int) -> None:
        costs = [("requests", key.requests_per_minute, 1.0), ("tokens", key.tokens_per_minute, float(tokens))]
        costs = [c for c in costs if c[1] > 0]
        if not costs:
            return
        if self.down and time.monotonic() < self._skip_until_s:
            return self._fallback(key, tokens)
        try:
            await self._charge_all(key, costs)
        except StoreDown:
            self._fallback(key, tokens)

    async def _charge_all(self, key: ApiKey, costs: list[tuple[str, int, float]]) -> None:
        """Takes every cost, or none: a request refused for its tokens gets its request back."""
        charged: list[tuple[Lease, float]] = []
        try:
            for kind, per_minute, cost in costs:
                lease = self._lease(key, kind, per_minute)
                await self._take(lease, cost, kind)
                charged.append((lease, cost))
        except BaseException:
            for lease, cost in charged:
                lease.level += cost
            raise

    def _lease(self, key: ApiKey, kind: str, per_minute: int) -> Lease:
        lease = self._leases.get((key.bucket, kind))
        if lease is None:
            lease = self._leases[(key.bucket, kind)] = Lease(store_bucket(key, kind), per_minute)
        lease.per_minute = per_minute
        return lease

    async def _take(self, lease: Lease, cost: float, kind: str) -> None:
        if lease.level >= cost:
            lease.level -= cost
            return
        now = time.monotonic()
        if now < lease.refused_until_s:
            raise _limited(kind, lease.full_at_s - now)
        need = cost - lease.level
        spare = math.floor(lease.per_minute / 60.0 * LEASE_S)
        take = functools.partial(self.store.take, lease.bucket, lease.per_minute, need, need + spare)
        granted, wait_s = await self._call(take)
        if wait_s > 0:
            now = time.monotonic()
            lease.refused_until_s, lease.full_at_s = now + min(wait_s, REFUSAL_HOLD_S), now + wait_s
            raise _limited(kind, wait_s)
        lease.level += granted - cost
        lease.taken_s = time.monotonic()

    async def _call(self, op: Callable[[], Awaitable[T]]) -> T:
        """One store call, bounded by ``timeout_s``; StoreDown when it fails."""
        self.store_calls += 1
        try:
            result = await asyncio.wait_for(op(), self.timeout_s)
        except (asyncio.CancelledError, RateLimited):
            raise
        except Exception as e:
            if not self.down:
                what = "admitting on each process's own buckets" if self.when_down == "open" else "refusing"
                log.warning(
                    "rate limits: store %s unavailable (%s); %s until it answers", self.store.name, e, what
                )
            self.down, self._skip_until_s = True, time.monotonic() + self.retry_s
            raise StoreDown from e
        if self.down:
            log.warning("rate limits: store %s answers again; limits are shared again", self.store.name)
            self.down = False
        return result

    def _fallback(self, key: ApiKey, tokens: int) -> None:
        self.fallbacks += 1
        if self.when_down == "closed":
            raise LimitsUnavailable(
                "rate limits cannot be checked (their store is unavailable); retry later", retry_after=1
            )
        self.admit(key, tokens)

    def settle(self, key: ApiKey, estimated: int, actual: int | None) -> None:
        lease = self._leases.get((key.bucket, "tokens"))
        if lease is None or actual is None:
            return super().settle(key, estimated, actual)
        lease.level += estimated - actual

    async def sweep(self, all_: bool = False) -> int:
        """Gives back what leases have not spent in ``LEASE_TTL_S`` (every lease with ``all_``); how many
        went back. A failed give-back is dropped: tokens lost to the tenant, never gained."""
        now = time.monotonic()
        stale = [ls for ls in self._leases.values() if ls.level and (all_ or now - ls.taken_s >= LEASE_TTL_S)]
        for lease in stale:
            amount, lease.level = lease.level, 0.0
            with contextlib.suppress(StoreDown):
                await self._call(functools.partial(self.store.give, lease.bucket, lease.per_minute, amount))
        return len(stale)

    def status(self) -> dict[str, Any]:
        return {
            "store": self.store.name,
            "when_down": self.when_down,
            "state": "down" if self.down else "up",
            "leases": len(self._leases),
            "store_calls": self.store_calls,
            "fallbacks": self.fallbacks,
        }


def _limited(kind: str, wait_s: float) -> RateLimited:
    return RateLimited(
        f"rate limit of {kind} per minute reached for this API key's tenant; retry later",
        retry_after=max(1, math.ceil(wait_s)),
    )
