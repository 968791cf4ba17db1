"""The retry budget and the backoff between attempts: a sick fleet is not hammered by retries.

**Budget.** Over a sliding window of ``WINDOW_S`` = 10 s (ten 1 s buckets) the gateway may retry at most

    ratio x requests in the window + floor_per_s x WINDOW_S

times (defaults: ``retry_budget`` 0.2, ``retry_budget_floor`` 3/s: retries stay under 20% of the traffic,
and a quiet gateway can still make 30 retries in 10 s). ``request()`` counts each routed request once;
``spend()`` asks for one retry and counts it when granted; ``has_room()`` asks without spending (a
replica's 5xx answer is relayed rather than dropped when no retry could follow). A refused retry
returns the last error to the client; the refusal is counted (``kvroute_retry_budget_exhausted_total``)
and logged once per exhaustion (again only after a retry was granted since).

**Backoff.** Before the k-th retry of a request (k = 0, 1, ...) the gateway sleeps a uniformly random
time in ``[0, min(backoff_max_s, backoff_s x 2^k)]`` ("full jitter"; defaults 25 ms and 250 ms): short,
since the next attempt goes to another replica, but spread so a fleet-wide hiccup does not come back as
one synchronized wave.
"""

from __future__ import annotations

import logging
import random
from collections import deque

log = logging.getLogger("kvroute.retry")
WINDOW_S = 10
BUCKET_S = 1.0


class RetryBudget:
    """Retries allowed over the last ``WINDOW_S`` seconds (see the module docstring)."""

    def __init__(self, ratio: float = 0.2, floor_per_s: float = 3.0) -> None:
        self.ratio, self.floor_per_s = ratio, floor_per_s
        self._buckets: deque[list[int]] = deque()  # [bucket index, requests, retries], oldest first
        self._exhausted = False

    def _bucket(self, now: float) -> list[int]:
        index = int(now // BUCKET_S)
        while self._buckets and self._buckets[0][0] <= index - WINDOW_S:
            self._buckets.popleft()
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append([index, 0, 0])
        return self._buckets[-1]

    def request(self, now: float) -> None:
        self._bucket(now)[1] += 1

    def allowed(self, now: float) -> float:
        """Retries the window allows in all (spent ones included)."""
        self._bucket(now)
        requests = sum(b[1] for b in self._buckets)
        return self.ratio * requests + self.floor_per_s * WINDOW_S

    def spent(self, now: float) -> int:
        self._bucket(now)
        return sum(b[2] for b in self._buckets)

    def has_room(self, now: float) -> bool:
        return self.spent(now) + 1 <= self.allowed(now)

    def spend(self, now: float) -> bool:
        """One retry, if the budget has room: counted and True; else False (``refused``)."""
        if not self.has_room(now):
            self.refused()
            return False
        self._bucket(now)[2] += 1
        self._exhausted = False
        return True

    def refused(self) -> None:
        """A retry the budget did not allow: logged once per exhaustion."""
        if not self._exhausted:
            log.warning("retry budget exhausted: returning errors instead of retrying them")
            self._exhausted = True


def backoff_s(retry: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Full jitter: uniform in [0, min(max_s, base_s x 2^retry)]."""
    return (rng or random).uniform(0.0, min(max_s, base_s * 2**retry))
