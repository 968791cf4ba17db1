"""A small console progress bar: one line, redrawn in place on a terminal, sparse lines otherwise.

    agent    kvroute-cost        [##########..........]  192/384  err 0   12.3s

On a TTY the line is redrawn with a carriage return at most every 0.1 s; when the stream is not a
TTY (CI logs, pipes) only the final line of each run is written, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts finished requests of one (workload, system) run and draws a bar."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self._label = label
        self._total = max(1, total)
        self._stream = stream if stream is not None else sys.stderr
        self._width = width
        self._done = 0
        self._errors = 0
        self._start = time.monotonic()
        self._drawn = 0.0
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())

    @property
    def done(self) -> int:
        return self._done

    @property
    def errors(self) -> int:
        return self._errors

    def line(self) -> str:
        filled = round(self._width * min(self._done, self._total) / self._total)
        bar = "#" * filled + "." * (self._width - filled)
        elapsed = time.monotonic() - self._start
        counts = f"{self._done:>5}/{self._total:<5} err {self._errors:<4}"
        return f"{self._label:<34} [{bar}] {counts} {elapsed:6.1f}s"

    def advance(self, error: bool = False) -> None:
        self._done += 1
        self._errors += int(error)
        now = time.monotonic()
        if self._tty and (now - self._drawn >= 0.1 or self._done >= self._total):
            self._drawn = now
            self._stream.write("\r" + self.line())
            self._stream.flush()

    def close(self, note: str = "") -> None:
        prefix = "\r" if self._tty else ""
        self._stream.write(prefix + self.line() + (f"  {note}" if note else "") + "\n")
        self._stream.flush()


def stage(text: str) -> None:
    """A stage line of a long bench command, on stderr."""
    print(f"== {text}", file=sys.stderr, flush=True)


def interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: asyncio.run cancels the run, and every `async with` stops its process."""
    raise KeyboardInterrupt
