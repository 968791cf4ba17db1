"""The oracle in the simulator: each request goes where the engines themselves predict the lowest TTFT.

``bench/systems/oracle.py`` asks every emulator over HTTP (``POST /_emu/predict``) for the TTFT the request
would get if it arrived now, from the replica's real radix cache and real queue, adds the work it forwarded
there that the replica has not acknowledged yet, and forwards to the lowest; exact ties rotate. Here the
engine is asked directly (``SimReplica.predict_ttft``) and a request reaches its engine the instant it is
routed, so there is never unacknowledged work to add. On a fleet of unequal speeds the request's own
part of the prediction is slowed by the replica's slow factor, as the engine will slow it.

Greedy per request: it does not foresee later requests, so it is a strong reference, not a bound (it
sends a document to the shortest queue even where that means computing it again). Draining replicas
take nothing new.
"""

from __future__ import annotations

from bench.sim.jobs import Job
from bench.sim.replica import SimReplica
from bench.sim.system import ORACLE, Outcome, Routed

TIE_S = 1e-9


class OracleSystem:
    def __init__(self) -> None:
        self.name = ORACLE
        self._replicas: dict[str, SimReplica] = {}
        self._draining: set[str] = set()
        self._turn = 0

    def joined(self, replica: SimReplica) -> None:
        self._replicas[replica.id] = replica

    def draining(self, replica_id: str) -> None:
        self._draining.add(replica_id)

    def removed(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)
        self._draining.discard(replica_id)

    def route(self, job: Job, now: float) -> Routed:
        live = [r for r in self._replicas.values() if r.id not in self._draining]
        ttfts = [(r.predict_ttft(job.work), r.id) for r in live]
        best = min(t for t, _ in ttfts)
        ties = [rid for t, rid in ttfts if t <= best + TIE_S]
        self._turn += 1
        return Routed(ties[self._turn % len(ties)])

    def first_token(self, routed: Routed, now: float) -> None:
        """The oracle learns nothing."""

    def finish(self, routed: Routed, outcome: Outcome, now: float) -> None:
        """The oracle learns nothing."""
