"""Is a replica working? When it last sent response body bytes, and a first-byte wait that lasts while
it does.

A request's first-byte deadline (``proxy/upstream/deadlines.py``) is scaled from its predicted TTFT, so that a
hung replica is found in seconds. A replica that is merely busier than predicted misses it too: a
request waiting in SGLang's queue for KV memory or a running slot, behind decoders that finish later
than the gateway thought (slow decode at a large batch, a machine running slower), sends nothing until
it is admitted. Timing it out there is the worst answer: it is aborted, loses its place in the queue,
is prefilled again from the start elsewhere, and its replica's circuit breaker counts a failure (in the
emulated `h200` fleet at load 0.6, 30 of 200 requests were moved so, and a breaker opened, in one run).

So a first-byte wait asks, when its deadline passes, whether the replica is still working: whether it
sent body bytes (a stream's chunk, a whole answer) to any request within the last ``window_s``. If it
did, the wait goes on, and is asked again when that evidence lapses (``last byte + window_s``); if it
went quiet, the deadline stands (the request is aborted and retried elsewhere, the breaker counts it).
The wait never outlasts ``request_timeout`` from its start. Response headers do not count: SGLang's
HTTP server sends a stream's headers at once, even while its scheduler is stuck.

A replica whose engine hangs as a whole (the failure the deadline exists for) goes quiet and is found
at most ``window_s`` after its last byte. One that keeps answering others while it never answers one
request would keep that request until ``request_timeout``; on a replica that starts prefills in
arrival order, such a request is overtaken by the requests sent after it (``proxy/fleet/load.py``), and once
it is ``FirstByteWait.stuck`` its wait goes on no more. ``beat`` is on the relay's hot path: one dict
store per chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType


def never() -> bool:
    """A request that is never stuck (``FirstByteWait.stuck``)."""
    return False


def always() -> bool:
    """A request that is always stuck: its wait never goes on past its deadline."""
    return True


@dataclass(frozen=True, slots=True)
class FirstByteWait:
    """One attempt's first-byte wait (loop times): its ``deadline``; its ``cap``, shared by its send and
    its first chunk; ``stuck()``: the request is known not to be queued (it waits on past the deadline
    no more, however the replica works)."""

    deadline: float
    cap: float
    stuck: Callable[[], bool] = never


class Liveness:
    """When each replica last sent body bytes (loop time), and how long that counts as working.

    ``beat`` records this gateway's own bytes; ``heard`` what another gateway saw
    (``proxy/sync/shared_docs.py`` ``LoadPart``): a replica that streams only to the other gateways' clients
    is working too, and a request of this one queued there would otherwise be timed out and moved. Only the
    own beats are shared (``quiet_s``), so an adopted one never comes back from a gateway that adopted it,
    later by each trip's lag, keeping a hung replica alive."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}  # by replica id: own beats
        self._heard: dict[str, float] = {}  # by replica id: the latest beat another gateway shared

    def beat(self, replica: str, now: float) -> None:
        self._last[replica] = now

    def heard(self, replica: str, at: float) -> None:
        """Another gateway saw body bytes from ``replica`` at the loop time ``at``."""
        if at > self._heard.get(replica, float("-inf")):
            self._heard[replica] = at

    def quiet_s(self, replica: str, now: float) -> float | None:
        """Seconds since this gateway's own last byte from ``replica`` (None: it never sent one)."""
        return _age(self._last.get(replica), now)

    def working_until(self, replica: str) -> float | None:
        """The loop time until which the replica counts as working (None: no byte seen or heard of)."""
        last = self._latest(replica)
        return None if last is None else last + self.window_s

    def since(self, replica: str, now: float) -> float | None:
        """Seconds since the replica's last body bytes, seen or heard of (None: never; for /status)."""
        return _age(self._latest(replica), now)

    def _latest(self, replica: str) -> float | None:
        last = max(self._last.get(replica, float("-inf")), self._heard.get(replica, float("-inf")))
        return None if last == float("-inf") else last


def _age(last: float | None, now: float) -> float | None:
    return None if last is None else max(0.0, now - last)


class PatientTimeout:
    """``asyncio.timeout_at(deadline)``, except that when the deadline passes, ``later()`` may name a
    later one (None: time is up now); never past ``cap``."""

    def __init__(
        self,
        deadline: float,
        cap: float,
        later: Callable[[], float | None],
        on_extend: Callable[[], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline, self._cap, self._later, self._on_extend = deadline, cap, later, on_extend
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None
        self.extended = False

    async def __aenter__(self) -> PatientTimeout:
        await self._timeout.__aenter__()
        self._handle = self._loop.call_at(min(self._deadline, self._cap), self._check)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(kind, exc, tb)

    def _check(self) -> None:
        now = self._loop.time()
        later = self._later() if now < self._cap else None
        if later is None or later <= now:
            self._handle = None
            self._timeout.reschedule(now)  # expires at once
            return
        if not self.extended and self._on_extend is not None:
            self._on_extend()
        self.extended = True
        self._handle = self._loop.call_at(min(later, self._cap), self._check)
