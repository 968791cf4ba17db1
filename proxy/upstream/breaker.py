"""A circuit breaker per replica: passive outlier ejection from the outcomes of real requests.

Beside the active health checks (``proxy/fleet/fleet.py``), which only see ``/health``, the breaker watches
what requests meet on the replica. States:

- **closed**: requests flow. ``failures`` consecutive failed attempts (a 5xx answer, a connection error,
  a first-byte or idle timeout, a stream cut) **trip** it; any good answer resets the count.
- **open**: the replica is not offered to the router for a cool-down of ``cooldown_s x 2^(trips-1)``
  (capped at ``cooldown_max_s``): repeated trips wait longer, ``trips`` counting the trips since the
  last good answer.
- **half-open**: the cool-down is over; exactly one trial request is let through (``acquire``). Its
  success closes the breaker (and resets the growth), its failure re-opens it at once. A good active
  health check (``probe_ok``) also closes a half-open breaker, keeping the growth: a replica whose
  ``/health`` answers while its requests fail trips again after the next ``failures`` and waits twice
  as long.

The fleet never lets breakers eject more than half of its replicas, nor the last one: past that,
failures are counted but trip nothing (``may_trip``). And a replica's 5xx answer reaches its breaker
only once another replica answered the same request well, below 400 (``proxy/dispatch/forward.py``): a 500
that follows the request, not the replica, blames nobody, nor does one followed by another replica's 4xx
(the request is bad). A 4xx answer, the client's bad request, is no verdict at all: neither a failure
nor a good answer. ``reset`` closes the breaker outright:
the fleet calls it when a replica comes back from unhealthy or restarted (a fresh process is used
again as soon as its health check passes). Times are ``time.monotonic()`` seconds, given by the
caller; the breaker does no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.config.settings import Settings


class BreakerState(enum.Enum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


STATE_CODES = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failures: int = 5  # consecutive failed attempts that trip a closed breaker
    cooldown_s: float = 5.0  # the first open period
    cooldown_max_s: float = 60.0  # the longest one, however often it trips

    @classmethod
    def of(cls, st: Settings) -> BreakerPolicy:
        """The policy the settings name."""
        return cls(st.breaker_failures, st.breaker_cooldown, st.breaker_cooldown_max)


class Breaker:
    """One replica's breaker (see the module docstring)."""

    __slots__ = ("_open_until", "_trial", "failures", "policy", "streak", "trips_total")

    def __init__(self, policy: BreakerPolicy | None = None) -> None:
        self.policy = policy or BreakerPolicy()
        self.failures = 0  # consecutive failures while closed
        self.streak = 0  # trips since the last good answer (the cool-down's exponent)
        self.trips_total = 0  # every trip since the replica joined (a metric)
        self._open_until: float | None = None  # None: closed
        self._trial = False  # the half-open trial is in flight

    def state(self, now: float) -> BreakerState:
        if self._open_until is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if now < self._open_until else BreakerState.HALF_OPEN

    def admits(self, now: float) -> bool:
        """May the router be offered this replica now (closed, or half-open with no trial out)?"""
        state = self.state(now)
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._trial)

    def acquire(self, now: float) -> bool:
        """Claims the right to send one request; in half-open only one trial at a time gets it."""
        if not self.admits(now):
            return False
        if self.state(now) is BreakerState.HALF_OPEN:
            self._trial = True
        return True

    def success(self) -> None:
        """A good answer: closes the breaker and forgets earlier trips."""
        self.failures = self.streak = 0
        self._open_until, self._trial = None, False

    def failure(self, now: float, may_trip: bool = True) -> bool:
        """A failed attempt; True when it tripped the breaker (closed to open, or a failed trial).
        ``may_trip`` False (too much of the fleet is ejected already): counted, but it stays closed."""
        state = self.state(now)
        if state is BreakerState.OPEN:
            return False  # a request sent before the trip, ending after it
        self.failures += 1
        if not may_trip:
            self._trial = False
            return False
        if state is BreakerState.HALF_OPEN or self.failures >= self.policy.failures:
            self._trip(now)
            return True
        return False

    def release(self) -> None:
        """An attempt that ended with no verdict (the client left): frees the trial, if it was one."""
        self._trial = False

    def probe_ok(self, now: float) -> None:
        """A good active health check closes a half-open breaker (the trip streak is kept)."""
        if self.state(now) is BreakerState.HALF_OPEN:
            self.failures, self._open_until, self._trial = 0, None, False

    def reset(self) -> None:
        """Closed, as new: the replica came back or restarted."""
        self.failures = self.streak = 0
        self._open_until, self._trial = None, False

    def _trip(self, now: float) -> None:
        self.streak += 1
        self.trips_total += 1
        self.failures = 0
        self._trial = False
        p = self.policy
        self._open_until = now + min(p.cooldown_max_s, p.cooldown_s * 2 ** (self.streak - 1))

    def status(self, now: float) -> dict[str, object]:
        """The /status view: state, consecutive failures, trips, seconds until half-open."""
        until = self._open_until
        return {
            "state": self.state(now).value,
            "failures": self.failures,
            "trips": self.trips_total,
            "open_for_s": round(max(0.0, until - now), 3) if until is not None else 0.0,
        }
