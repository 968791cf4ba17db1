"""What each gateway publishes about itself besides events: one document per kind, renewed on a period.

``proxy/sync/state_sync.py`` publishes every part's ``export`` each ``every_s`` (with a ``ttl_s`` after which
a silent gateway's document is gone) and hands every part the other gateways' latest documents of its
kind (``adopt``: gateway -> decoded JSON). Three parts:

- ``LoadPart`` (every round, ttl 5 s): per replica, this gateway's in-flight requests, queued prefill
  tokens and seconds, arrival rate, busy fraction and held KV; adopted as ``Replica.remote``, which every
  snapshot adds to the local load (``proxy.fleet.load.combined``), so gateways do not all pick the same idle
  replica at once. With them, when this gateway last received body bytes from the replica (wall-clock
  seconds, so that a document read again before its next version does not move it; -1: never), adopted
  into ``proxy.upstream.liveness.Liveness`` (``heard``): a request queued on a replica that streams only to
  the other gateways' clients waits on there past its first-byte deadline, as if this gateway saw the bytes;
- ``RatesPart`` (every round, ttl 30 s): the rates this gateway learned itself
  (``RateBook.export``); adopted with ``RateBook.adopt`` (pooled by samples);
- ``CalibrationPart`` (every second, ttl 30 s): its token estimate, bytes per engine token and the
  reports it learned from; adopted with ``Router.adopt_calibration``, so a gateway that starts among
  others predicts with their estimate instead of the default 4 characters per token;
- the warm-up registry (``proxy/warm/api.py`` adds it: ``WarmupsPart``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from proxy.fleet.fleet import Fleet
from proxy.fleet.load import LoadView
from proxy.upstream.liveness import Liveness
from routing.rates import RateBook, SharedRates
from routing.router import Router


class Part(Protocol):
    kind: str
    every_s: float  # 0: every round
    ttl_s: float

    def export(self) -> Any: ...

    def adopt(self, docs: dict[str, Any]) -> None: ...


class LoadPart:
    kind, every_s, ttl_s = "load", 0.0, 5.0

    def __init__(self, fleet: Fleet, liveness: Liveness | None = None) -> None:
        self.fleet = fleet
        self.liveness = liveness

    def export(self) -> dict[str, list[float]]:
        now = time.monotonic()
        out = {}
        for r in self.fleet.replicas():
            v = r.load.view(now, 0, r.pricing(r.id), 0, r.running_reserve)  # priced as snapshots price it
            quiet = self.liveness.quiet_s(r.id, now) if self.liveness is not None else None
            out[r.id] = [
                v.inflight_requests,
                v.inflight_prefill_tokens,
                v.inflight_prefill_s,
                v.arrival_rate,
                v.utilization,
                v.kv_tokens,
                -1.0 if quiet is None else time.time() - quiet,
            ]
        return out

    def adopt(self, docs: dict[str, Any]) -> None:
        """Sums the other gateways' numbers per replica (the busy fraction: the largest, as
        ``proxy.fleet.load.combined`` says why)."""
        sums: dict[str, list[float]] = {}
        for table in docs.values():
            for replica, numbers in table.items():
                acc = sums.setdefault(replica, [0.0] * 6)
                for i, v in enumerate(numbers[:4]):
                    acc[i] += float(v)
                acc[4] = max(acc[4], min(float(numbers[4]), 1.0))
                acc[5] += float(numbers[5]) if len(numbers) > 5 else 0.0  # a gateway before held KV
        for r in self.fleet.replicas():
            n = sums.get(r.id)
            r.remote = LoadView(int(n[0]), int(n[1]), n[2], (), n[3], n[4], int(n[5])) if n else None
        if self.liveness is not None:
            adopt_last_bytes(docs, self.liveness, time.monotonic(), time.time())


def adopt_last_bytes(docs: dict[str, Any], liveness: Liveness, now: float, wall: float) -> None:
    """The other gateways' last bytes from each replica (``LoadPart`` documents), in this gateway's loop
    time: ``now`` is the loop time at the wall-clock time ``wall``; a clock ahead of ours counts as now."""
    for table in docs.values():
        for replica, numbers in table.items():
            if len(numbers) > 6 and float(numbers[6]) >= 0.0:  # a gateway before sent no last byte
                liveness.heard(replica, now - max(0.0, wall - float(numbers[6])))


class RatesPart:
    kind, every_s, ttl_s = "rates", 0.0, 30.0

    def __init__(self, rates: RateBook) -> None:
        self.rates = rates

    def export(self) -> dict[str, Any]:
        mine = self.rates.export()
        return {"fleet": mine.fleet, "replicas": mine.replicas}

    def adopt(self, docs: dict[str, Any]) -> None:
        peers = [
            SharedRates(_row(d["fleet"]), {r: _row(v) for r, v in d["replicas"].items()})
            for d in docs.values()
        ]
        self.rates.adopt(peers)


class CalibrationPart:
    kind, every_s, ttl_s = "calibration", 1.0, 30.0

    def __init__(self, router: Router) -> None:
        self.router = router

    def export(self) -> list[float]:
        return [self.router.tokens.bytes_per_token, float(self.router.tokens.samples)]

    def adopt(self, docs: dict[str, Any]) -> None:
        self.router.adopt_calibration([(float(d[0]), int(d[1])) for d in docs.values()])


def _row(v: list[float]) -> tuple[float, float, float, float, float, int]:
    return float(v[0]), float(v[1]), float(v[2]), float(v[3]), float(v[4]), int(v[5])


class Schedule:
    """Which parts are due in a round (``every_s`` since they last went)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def due(self, parts: list[Part], now: float) -> list[Part]:
        out = [p for p in parts if now - self._last.get(p.kind, -1e9) >= p.every_s]
        for p in out:
            self._last[p.kind] = now
        return out
