"""Admission: whether the gateway takes a generation request at all, before it is routed.

Two bounds keep an overload from turning into a collapse (every accepted request waiting longer and
longer until all of them time out):

- **in the gateway**: at most ``max_inflight`` generation requests in progress (read, routed, relayed);
  the next one gets 429 at once. This bounds the gateway's own memory and sockets.
- **per replica**: at most ``max_waiting_per_replica`` requests *waiting* on one replica (sent, first
  byte not back: ``proxy.load.ReplicaLoad.queue``). Routing only sees the replicas below their bound
  (``admissible``), so it prefers them by construction; when every healthy candidate is full the
  request gets 429 with a ``Retry-After`` of the predicted time for the shortest queue to drain (its
  queued prefill seconds, at least 1). The default (0) is the replica's own ``max_running_requests``:
  SGLang runs at most that many requests, so a full second batch waiting already doubles a new request's
  TTFT; beyond that, waiting only adds latency without adding throughput. Benchmarks at the concurrencies
  in ``bench/`` (<= 64 per replica) never reach it.

While the gateway drains (SIGTERM, ``proxy/drain.py``) new generation requests get 503 ``draining``
with ``Retry-After: 1`` (a load balancer sends them to another gateway); ``idle`` is set whenever no
generation request is in progress. Counted: refusals by reason (``kvroute_rejections_total``) and the
``/status`` section ``admission``. Only this gateway's requests are counted, not other gateways'.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from proxy.errors import Draining, Overloaded
from proxy.fleet import Fleet
from routing.types import ReplicaState

UNKNOWN_MAX_RUNNING = 256  # the bound for a replica that did not report max_running_requests
DRAIN_RETRY_AFTER_S = 1


class Admission:
    def __init__(self, max_inflight: int, max_waiting_per_replica: int) -> None:
        self.max_inflight = max_inflight
        self.max_waiting_per_replica = max_waiting_per_replica
        self.inflight = 0
        self.draining = False
        self.idle = asyncio.Event()
        self.idle.set()
        self.rejected: Counter[str] = Counter()
        self.on_reject: Callable[[str], None] = lambda reason: None

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        self.on_reject(reason)

    def enter(self) -> None:
        """One generation request starts; 503 while draining, 429 past ``max_inflight``."""
        if self.draining:
            self.reject("draining")
            raise Draining(
                "kvroute is shutting down; retry on another gateway", retry_after=DRAIN_RETRY_AFTER_S
            )
        if self.inflight >= self.max_inflight:
            self.reject("gateway_full")
            raise Overloaded(
                f"kvroute has {self.inflight} requests in progress (max_inflight); retry later",
                retry_after=1,
            )
        self.inflight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self.idle.set()

    def bound(self, state: ReplicaState) -> int:
        if self.max_waiting_per_replica > 0:
            return self.max_waiting_per_replica
        return state.max_running_requests or UNKNOWN_MAX_RUNNING

    def admissible(self, states: list[ReplicaState], fleet: Fleet) -> list[ReplicaState]:
        """The replicas below their waiting bound; 429 when every healthy candidate is at it."""
        open_ = [s for s in states if s.healthy and not s.draining]
        if not open_:
            return states  # nothing healthy: the router answers 503
        below = [s for s in open_ if _waiting(fleet, s) < self.bound(s)]
        if below:
            return below
        self.reject("replicas_full")
        wait_s = min(s.inflight_prefill_s for s in open_)
        raise Overloaded(
            f"every replica has its maximum of requests waiting ({self.bound(open_[0])}); retry later",
            retry_after=max(1, math.ceil(wait_s)),
        )

    def status(self) -> dict[str, Any]:
        return {
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "max_waiting_per_replica": self.max_waiting_per_replica or "max_running_requests",
            "draining": self.draining,
            "rejected": dict(self.rejected),
        }


def _waiting(fleet: Fleet, state: ReplicaState) -> int:
    replica = fleet.get(state.id)
    return len(replica.load.queue) if replica is not None else 0
