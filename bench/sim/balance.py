"""The fleet-balance metric: seconds a replica sits idle while another replica has a queue.

A replica is **idle** while no request is running or queued on it (every request sent to it has ended),
and **has a queue** while at least one request sent to it waits for admission (the engine's FCFS
waiting list: not yet scheduled into a prefill step, for want of a turn, a running slot or KV memory).
Idle-while-queued seconds of replica r = the time r is in the fleet and idle while some other replica
in the fleet has a queue: capacity left unused while requests wait elsewhere, the waste a router that
balanced perfectly would not have. A draining replica counts neither as idle nor as queued (it may take
nothing new): it leaves the metric when its drain starts.

``BalanceMeter`` integrates it exactly over piecewise-constant states: the simulator tells it every
change of a replica's counts (``arrived``, ``admitted``, ``ended``) and membership (``joined``,
``left``) at the virtual time it happens; between two changes nothing moves. O(replicas) per change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Counts:
    inflight: int = 0  # arrived, not ended (running or queued)
    waiting: int = 0  # arrived, not admitted yet
    present: bool = True


class BalanceMeter:
    def __init__(self) -> None:
        self._at = 0.0
        self._counts: dict[str, _Counts] = {}
        self.idle_while_queued: dict[str, float] = {}

    def joined(self, replica: str, now: float) -> None:
        self._advance(now)
        self._counts[replica] = _Counts()
        self.idle_while_queued.setdefault(replica, 0.0)

    def left(self, replica: str, now: float) -> None:
        self._advance(now)
        self._counts[replica].present = False

    def arrived(self, replica: str, now: float) -> None:
        self._advance(now)
        c = self._counts[replica]
        c.inflight += 1
        c.waiting += 1

    def admitted(self, replica: str, now: float) -> None:
        self._advance(now)
        self._counts[replica].waiting -= 1

    def ended(self, replica: str, now: float, admitted: bool) -> None:
        """A request ended (finished or failed); ``admitted``: whether it had left the waiting list."""
        self._advance(now)
        c = self._counts[replica]
        c.inflight -= 1
        if not admitted:
            c.waiting -= 1

    def close(self, now: float) -> None:
        self._advance(now)

    @property
    def total(self) -> float:
        return sum(self.idle_while_queued.values())

    def _advance(self, now: float) -> None:
        dt = now - self._at
        self._at = now
        if dt <= 0.0:
            return
        present = [(r, c) for r, c in self._counts.items() if c.present]
        if not any(c.waiting > 0 for _, c in present):
            return
        for r, c in present:  # an idle replica has no queue itself: the queue is another's
            if c.inflight == 0:
                self.idle_while_queued[r] += dt
