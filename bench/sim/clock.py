"""The simulator's virtual clock: an asyncio event loop whose time jumps to the next timer.

``VirtualLoop`` is an ``asyncio.BaseEventLoop`` with no selector and no sockets (no self-pipe either:
nothing here is thread-safe, nothing needs to be). Its ``time()`` is a number it keeps itself, starting
at 0, and its ``_run_once`` (one iteration of the loop) takes asyncio's own steps without the I/O poll:
drop cancelled timers at the head of the heap; when no callback is ready, jump the clock to the earliest
timer; move the timers due now to the ready queue; run the callbacks that were ready, in order. So the
loop runs every ready callback at the current instant, and once every task is blocked it jumps to the
next scheduled timer: a 10-minute modelled run takes as long as its callbacks do, whatever the sleeps.
A blocked loop with no timer at all can never wake again: ``Deadlock`` is raised instead of hanging.

It reads the loop's own queues (``_ready``, ``_scheduled``: private, the same in CPython 3.8-3.13;
construction fails loudly if a Python version ever renames them). Delegating to ``BaseEventLoop.
_run_once`` with a "selector" whose wait moves the clock works too, and was 10-15% slower on a
simulated run (~10^5 iterations).

``looptime`` (PyPI) does the same for tests, but patches a selector event loop (a socket pair for its
self-pipe, a real ``select(0)`` per iteration) and spends 42 no-op iterations before each jump; a
simulated fleet jumps ~10^5 times per run, so a loop of our own is both simpler and much faster.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is scheduled: the simulation can never progress."""


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop in virtual time (module docstring)."""

    # BaseEventLoop's own queues (set by its __init__), declared for the type checker
    _ready: deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _stopping: bool
    _timer_cancelled_count: int

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-9
        self._check_internals()

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        """One iteration (module docstring)."""
        ready, timers = self._ready, self._scheduled
        while timers and timers[0].cancelled():
            self._timer_cancelled_count -= 1
            heapq.heappop(timers)._scheduled = False  # type: ignore[attr-defined]
        if not ready and not self._stopping:
            if not timers:
                raise Deadlock("every task is blocked and no timer is scheduled")
            self._now = max(self._now, timers[0].when())
        end = self._now + self._clock_resolution
        while timers and timers[0].when() < end:
            timer = heapq.heappop(timers)
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle.cancelled():
                handle._run()

    def _check_internals(self) -> None:
        for name in ("_ready", "_scheduled", "_stopping", "_timer_cancelled_count"):
            if not hasattr(self, name):
                raise RuntimeError(f"asyncio.BaseEventLoop has no {name} in this Python: update VirtualLoop")

    def _process_events(self, event_list: list[Any]) -> None:
        """No I/O events ever arrive."""

    def _write_to_self(self) -> None:
        """No other thread wakes this loop (``call_soon_threadsafe`` only queues the callback)."""


def run_virtual(main: Coroutine[Any, Any, T]) -> tuple[T, float]:
    """Runs ``main`` to completion on a fresh ``VirtualLoop``: (its result, the virtual time at the end).
    Tasks still pending at the end are cancelled and awaited, as ``asyncio.run`` does."""
    loop = VirtualLoop()
    try:
        asyncio.set_event_loop(loop)
        result = loop.run_until_complete(main)
        end = loop.time()
        _cancel_all(loop)
        return result, end
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _cancel_all(loop: VirtualLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
