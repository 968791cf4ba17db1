"""The fleet-balance metric as this gateway sees it: seconds each replica sits idle while another has a
queue (``kvroute_replica_idle_while_queued_seconds_total``): capacity left unused while requests wait
elsewhere, the waste a router that balanced perfectly would not have.

From the gateway's view of its own requests: a replica is **idle** while no request this gateway sent
it is in flight, and **has a queue** while at least ``QUEUED`` of them await their first byte (one being
prefilled, the others waiting behind it: an approximation of the engine's waiting list, which the
gateway cannot see). A replica that is draining or out of the pool counts as neither. The simulator
and the benchmark report the same quantity (``bench/sim/balance.py``, ``bench/reports``).

``Balance.update(replicas, now)`` integrates over the time since the previous update, with the states
as they were then (they only change when a lease does, and every lease change calls it); O(replicas)
per update.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.fleet.replica import Replica

QUEUED = 2  # requests awaiting their first byte at which a replica counts as having a queue


class Balance:
    def __init__(self) -> None:
        self.idle_while_queued: dict[str, float] = {}
        self._at: float | None = None
        self._idle: list[str] = []  # idle replicas as of the last update, when another had a queue

    def update(self, replicas: Iterable[Replica], now: float) -> None:
        """Credits the interval since the last update, then takes the states as they are now."""
        if self._at is not None:
            dt = max(0.0, now - self._at)
            for rid in self._idle:
                self.idle_while_queued[rid] = self.idle_while_queued.get(rid, 0.0) + dt
        self._at = now
        serving = [r for r in replicas if r.healthy and not r.draining]
        queued = any(len(r.load.queue) >= QUEUED for r in serving)
        self._idle = [r.id for r in serving if r.inflight_requests == 0] if queued else []

    def forget(self, replica: str) -> None:
        self.idle_while_queued.pop(replica, None)
