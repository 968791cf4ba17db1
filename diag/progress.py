"""Progress of a diagnostic on stderr: which step, tokens sent so far, time elapsed since the start.

    kvroute probe  2/4 pressure 3/6      36,602 tokens   sent 113,206   elapsed  52.1 s   TTFT 13.71 s

Each request is one line, written when it finishes. On a terminal the line is also drawn while the
request runs and redrawn in place every 0.25 s (a cold 128K prefill takes minutes), then finished with
its TTFT. ``enabled=False`` (``--quiet``) writes nothing. Progress never shows prompt text.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable
from typing import TextIO, TypeVar

T = TypeVar("T")
TICK_S = 0.25


class Progress:
    def __init__(self, command: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.command = command
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._start = time.monotonic()
        self.sent_tokens = 0

    def line(self, label: str, tokens: int, tail: str = "") -> str:
        elapsed = time.monotonic() - self._start
        head = f"{self.command}  {label:<20} {tokens:>9,} tokens   sent {self.sent_tokens:>11,}"
        return f"{head}   elapsed {elapsed:6.1f} s{('   ' + tail) if tail else ''}"

    def _write(self, text: str, end: str) -> None:
        if self._enabled:
            self._stream.write(f"\r{text}\x1b[K{end}" if self._tty else text + end)
            self._stream.flush()

    async def _tick(self, label: str, tokens: int) -> None:
        while True:
            self._write(self.line(label, tokens, "running"), "")
            await asyncio.sleep(TICK_S)

    async def request(self, label: str, tokens: int, work: Awaitable[T]) -> T:
        """Awaits ``work`` (one request of ``tokens`` prompt tokens) and reports it."""
        ticker = asyncio.ensure_future(self._tick(label, tokens)) if self._tty and self._enabled else None
        try:
            result = await work
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
        self.sent_tokens += tokens
        measured = getattr(result, "ttft_s", None)
        self._write(
            self.line(label, tokens, f"TTFT {measured:.2f} s" if measured is not None else "done"), "\n"
        )
        return result

    def note(self, text: str) -> None:
        """A line that is not a request (e.g. a cache flush)."""
        self._write(f"{self.command}  {text}", "\n")
