"""What the operator hears about replica health: every failure and recovery, never a flood.

- A replica's first failed check is logged at once (WARNING), whether it was healthy or never came up
  (a backend that can never be reached must not fail silently), with the reason and the retry interval.
- While it keeps failing it is logged again at most every ``REPEAT_S`` seconds, with the count since the
  last line, so a dead backend leaves one line a minute, not one per check.
- Its recovery is logged once (INFO), with how long it was out.
- When no replica at all is healthy, that is said too (at most every ``REPEAT_S``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger("kvroute.fleet")
REPEAT_S = 60.0


@dataclass(slots=True)
class Outage:
    """Something failing (a replica, a discovery name): since when, its last log line, failures since."""

    since_s: float
    logged_s: float
    failures: int = 0  # since the last line

    @classmethod
    def begin(cls) -> Outage:
        now = time.monotonic()
        return cls(now, now)

    def again(self) -> tuple[float, int] | None:
        """One more failure: (seconds out, failures since the last line) when a repeat line is due, at
        most every ``REPEAT_S``; None otherwise."""
        now = time.monotonic()
        self.failures += 1
        if now - self.logged_s < REPEAT_S:
            return None
        due = (now - self.since_s, self.failures)
        self.logged_s, self.failures = now, 0
        return due

    def seconds(self) -> float:
        return time.monotonic() - self.since_s


class HealthLog:
    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._outages: dict[str, Outage] = {}
        self._none_logged_s = -REPEAT_S

    def failed(self, replica: str, reason: str, was_healthy: bool) -> None:
        outage = self._outages.get(replica)
        if outage is None:
            self._outages[replica] = Outage.begin()
            state = "out of the pool" if was_healthy else "not in the pool yet"
            log.warning(
                "replica %s unreachable, %s: %s (retrying every %gs)", replica, state, reason, self._interval
            )
        elif due := outage.again():
            log.warning(
                "replica %s still unreachable after %.0fs (%d more failed checks): %s", replica, *due, reason
            )

    def recovered(self, replica: str, model: str) -> None:
        outage = self._outages.pop(replica, None)
        if outage is None:
            log.info("replica %s healthy (model %s)", replica, model)
        else:
            log.info("replica %s healthy again after %.0fs (model %s)", replica, outage.seconds(), model)

    def fleet(self, healthy: int, total: int) -> None:
        now = time.monotonic()
        if healthy == 0 and total > 0 and now - self._none_logged_s >= REPEAT_S:
            log.warning("no healthy replica (%d configured): requests get 503 until one answers", total)
            self._none_logged_s = now
        elif healthy > 0:
            self._none_logged_s = -REPEAT_S
