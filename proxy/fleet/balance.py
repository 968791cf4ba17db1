"""The fleet-balance metric as this gateway sees it: seconds each replica sits idle while another has a
queue (``kvroute_replica_idle_while_queued_seconds_total``): capacity left unused while requests wait
elsewhere, the waste a router that balanced perfectly would not have.

From the gateway's view of its own requests: a replica is **idle** while no request this gateway sent
it is in flight, and **has a queue** while at least ``QUEUED`` of them await their first byte (one being
prefilled, the others waiting behind it: an approximation of the engine's waiting list, which the
gateway cannot see). A replica that is draining or out of the pool counts as neither. The simulator
and the benchmark report the same quantity (``bench/sim/balance.py``, ``bench/reports``).

O(1) per change: one clock ``queued_s`` runs while any replica has a queue; an idle replica notes its
reading when it turns idle and is credited the difference when it stops (or when read). ``changed``
takes one replica's new state (every lease change on it calls it); ``refresh`` takes them all (health
and drain changes, which no lease reports, are caught there: the metrics scrape calls it).
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.fleet.replica import Replica

QUEUED = 2  # requests awaiting their first byte at which a replica counts as having a queue


class Balance:
    def __init__(self) -> None:
        self._credit: dict[str, float] = {}  # seconds credited for idle spells that ended
        self._idle_since: dict[str, float] = {}  # idle replicas -> ``queued_s`` when their spell began
        self._queued: set[str] = set()  # replicas with a queue
        self.queued_s = 0.0  # seconds during which some replica had a queue
        self._at: float | None = None

    def changed(self, replica: Replica, now: float) -> None:
        """One replica's state may have changed (a lease on it did)."""
        self._advance(now)
        rid, serving = replica.id, replica.healthy and not replica.draining
        if serving and len(replica.load.queue) >= QUEUED:
            self._queued.add(rid)
        else:
            self._queued.discard(rid)
        idle = serving and replica.inflight_requests == 0
        if idle and rid not in self._idle_since:
            self._idle_since[rid] = self.queued_s
        elif not idle and rid in self._idle_since:
            self._credit[rid] = self._credit.get(rid, 0.0) + self.queued_s - self._idle_since.pop(rid)

    def refresh(self, replicas: Iterable[Replica], now: float) -> None:
        for r in replicas:
            self.changed(r, now)

    def seconds(self, replica: str) -> float:
        """Idle-while-queued seconds of ``replica`` up to the last change or refresh."""
        since = self._idle_since.get(replica)
        return self._credit.get(replica, 0.0) + (self.queued_s - since if since is not None else 0.0)

    def forget(self, replica: str) -> None:
        for book in (self._credit, self._idle_since):
            book.pop(replica, None)
        self._queued.discard(replica)

    def _advance(self, now: float) -> None:
        if self._queued and self._at is not None:
            self.queued_s += max(0.0, now - self._at)
        self._at = now
