"""Admission: whether the gateway takes a generation request at all, before it is routed.

Two bounds keep an overload from turning into a collapse (every accepted request waiting longer and
longer until all of them time out):

- **in the gateway**: at most ``max_inflight`` generation requests in progress (read, routed, relayed);
  the next one gets 429 at once. This bounds the gateway's own memory and sockets.
- **per replica**: a replica is full when the requests *waiting* on it (sent, first byte not back:
  ``proxy.fleet.load.ReplicaLoad.queue``) have reached ``max_waiting_per_replica`` **and** their predicted
  prefill (the snapshot's ``inflight_prefill_s``, other gateways' included) has reached
  ``max_queue_s`` (60 s): the bound is in time, what a newcomer would wait, not in requests (a burst of
  a hundred short chat turns drains in well under a second and must not be refused; a dozen queued
  128K-token cold prefills is minutes). The count (default 0: twice the replica's
  ``max_running_requests``, SGLang's batch) only keeps the time bound from being crossed by a flood of
  requests whose predictions are small. Routing only sees the replicas that are not full
  (``admissible``), so it prefers them by construction; when every healthy candidate is full the request
  gets 429 with a ``Retry-After`` of the predicted time for the shortest queue to drain below the time
  bound (at least 1 s).

While the gateway drains (SIGTERM, ``proxy/runtime/drain.py``) new generation requests get 503 ``draining``
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
from proxy.fleet.fleet import Fleet
from routing.types import ReplicaState

UNKNOWN_MAX_RUNNING = 256  # the batch of a replica that did not report max_running_requests
BATCHES = 2  # the default count bound: this many of the replica's batches waiting
DRAIN_RETRY_AFTER_S = 1


class Admission:
    def __init__(self, max_inflight: int, max_waiting_per_replica: int, max_queue_s: float = 60.0) -> None:
        self.max_inflight = max_inflight
        self.max_waiting_per_replica = max_waiting_per_replica
        self.max_queue_s = max_queue_s
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
        return BATCHES * (state.max_running_requests or UNKNOWN_MAX_RUNNING)

    def full(self, state: ReplicaState, fleet: Fleet) -> bool:
        """Both bounds reached: requests waiting and their predicted prefill seconds."""
        return _waiting(fleet, state) >= self.bound(state) and state.inflight_prefill_s >= self.max_queue_s

    def admissible(self, states: list[ReplicaState], fleet: Fleet) -> list[ReplicaState]:
        """The replicas that are not full; 429 when every healthy candidate is."""
        open_ = [s for s in states if s.healthy and not s.draining]
        if not open_:
            return states  # nothing healthy: the router answers 503
        below = [s for s in open_ if not self.full(s, fleet)]
        if below:
            return below
        self.reject("replicas_full")
        wait_s = min(s.inflight_prefill_s for s in open_) - self.max_queue_s
        raise Overloaded(
            f"every replica has at least {self.bound(open_[0])} requests and {self.max_queue_s:g} s of "
            "predicted prefill waiting; retry later",
            retry_after=max(1, math.ceil(wait_s)),
        )

    def status(self) -> dict[str, Any]:
        return {
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "max_waiting_per_replica": self.max_waiting_per_replica or f"{BATCHES} x max_running_requests",
            "max_queue_s": self.max_queue_s,
            "draining": self.draining,
            "rejected": dict(self.rejected),
        }


def _waiting(fleet: Fleet, state: ReplicaState) -> int:
    replica = fleet.get(state.id)
    return len(replica.load.queue) if replica is not None else 0
