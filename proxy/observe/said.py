"""Warnings said once, then at a bounded rate: a condition that lasts is not a log line a second.

``Said.warn(key, message)`` logs the first time a key is seen and then at most once every ``every_s``
seconds while it keeps coming back, with how many repeats were held back since; ``clear(key)`` forgets
it (the condition ended), so the next occurrence is said at once. ``active`` lists the keys said and
not cleared, with their last message: what ``/status`` shows as warnings.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    message: str
    said_at: float
    held: int = 0


class Said:
    def __init__(self, log: logging.Logger, every_s: float = 60.0) -> None:
        self._log, self._every = log, every_s
        self._entries: dict[str, _Entry] = {}

    def warn(self, key: str, message: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        e = self._entries.get(key)
        if e is None or now - e.said_at >= self._every:
            held = f" ({e.held} more since the last time)" if e is not None and e.held else ""
            self._log.warning("%s%s", message, held)
            self._entries[key] = _Entry(message, now)
            return
        e.held += 1
        e.message = message

    def clear(self, key: str) -> None:
        self._entries.pop(key, None)

    def active(self) -> dict[str, str]:
        return {k: e.message for k, e in self._entries.items()}
