"""Per-tenant rate limits: requests per minute and tokens per minute, as token buckets.

Each bucket (a tenant, or a key without one: ``proxy.tenancy.keys.ApiKey.bucket``) holds up to one minute's
allowance and refills continuously (``limit / 60`` per second). A request is admitted when the bucket
holds its cost, or is full (so a request larger than a whole minute's allowance still passes, alone);
else 429 ``rate_limit_exceeded`` with ``Retry-After``: the seconds until the bucket holds it again.

Tokens are charged up front on an estimate (prompt bytes / ``BYTES_PER_TOKEN`` + the output budget) and
settled when the answer is over with the usage the replica reported (prompt + completion tokens): the
bucket is credited or debited by the difference, and may go below zero (the next requests wait longer).
A request refused for its tokens is not charged a request, and the reverse. Nothing here does I/O;
time is ``time.monotonic`` unless given. These buckets are this process's own; with a state store the
limits hold per deployment instead (``proxy/tenancy/shared_limits.py``), and these buckets are its
fallback while the store is down.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from proxy.errors import RateLimited
from proxy.tenancy.keys import ApiKey

BYTES_PER_TOKEN = 4  # a rough prompt estimate before the replica counts


@dataclass(slots=True)
class Bucket:
    per_minute: int
    level: float
    at_s: float

    def refill(self, now: float) -> None:
        self.level = min(float(self.per_minute), self.level + (now - self.at_s) * self.per_minute / 60.0)
        self.at_s = now

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0: it fits now)."""
        need = min(cost, float(self.per_minute))
        return 0.0 if self.level >= need else (need - self.level) * 60.0 / self.per_minute


class RateLimiter:
    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def _bucket(self, key: ApiKey, kind: str, per_minute: int, now: float) -> Bucket | None:
        if per_minute <= 0:
            return None
        b = self._buckets.get((key.bucket, kind))
        if b is None:
            b = self._buckets[(key.bucket, kind)] = Bucket(per_minute, float(per_minute), now)
        b.refill(now)
        return b

    def admit(self, key: ApiKey, tokens: int, now: float | None = None) -> None:
        """Charges one request and ``tokens`` estimated tokens, or raises RateLimited."""
        now = time.monotonic() if now is None else now
        reqs = self._bucket(key, "requests", key.requests_per_minute, now)
        toks = self._bucket(key, "tokens", key.tokens_per_minute, now)
        waits = [
            (b.wait_s(cost), what) for b, cost, what in ((reqs, 1, "requests"), (toks, tokens, "tokens")) if b
        ]
        wait_s, what = max(waits, default=(0.0, ""))
        if wait_s > 0:
            raise RateLimited(
                f"rate limit of {what} per minute reached for this API key's tenant; retry later",
                retry_after=max(1, math.ceil(wait_s)),
            )
        if reqs is not None:
            reqs.level -= 1
        if toks is not None:
            toks.level -= tokens

    async def charge(self, key: ApiKey, tokens: int) -> None:
        """``admit``, awaited by the request path: a limiter shared between gateways
        (``proxy/tenancy/shared_limits.py``) may ask its store first."""
        self.admit(key, tokens)

    def settle(self, key: ApiKey, estimated: int, actual: int | None) -> None:
        """Corrects a request's token charge with what it really used (None: unknown, kept)."""
        b = self._buckets.get((key.bucket, "tokens"))
        if b is not None and actual is not None:
            b.level += estimated - actual


def estimate_tokens(size_bytes: int, max_new_tokens: int | None) -> int:
    return size_bytes // BYTES_PER_TOKEN + (max_new_tokens or 0)
