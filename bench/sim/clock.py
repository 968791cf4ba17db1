"""The simulator's virtual clock: an asyncio event loop whose time jumps to the next timer.

``VirtualLoop`` is an ``asyncio.BaseEventLoop`` with no selector and no sockets (no self-pipe either:
nothing here is thread-safe, nothing needs to be). Its ``time()`` is a number it keeps itself, starting
at 0. Each iteration of asyncio's own ``_run_once`` asks the "selector" to wait ``timeout`` seconds for
I/O: there is no I/O, so the wait is instant and the clock moves forward by ``timeout`` instead, which
asyncio computed as the time to the earliest timer (0 while callbacks are ready). So the loop runs
every ready callback at the current instant, and once every task is blocked it jumps to the next
scheduled timer: a 10-minute modelled run takes as long as its callbacks do, whatever the sleeps.

A blocked loop with no timer at all (``timeout`` None) can never wake again: ``Deadlock`` is raised
instead of hanging.

``looptime`` (PyPI) does the same for tests, but patches a selector event loop (a socket pair for its
self-pipe, a real ``select(0)`` per iteration) and spends 42 no-op iterations before each jump; a
simulated fleet jumps ~10^5 times per run, so a loop of our own is both simpler and much faster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is scheduled: the simulation can never progress."""


class _NoIo:
    """What ``BaseEventLoop._run_once`` calls ``_selector``: waiting moves the virtual clock."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise Deadlock("every task is blocked and no timer is scheduled")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self) -> None:
        """Nothing to release."""


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop in virtual time (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _NoIo(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

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
