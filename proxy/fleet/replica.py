"""One replica's runtime record and one request's lease on its load.

- ``Replica``: what the fleet knows of one replica (its info from ``/get_server_info``, health, draining,
  circuit breaker, load, its role in a prefill/decode fleet: ``proxy/fleet/roles.py``) and its routing
  snapshot (``state``, a ``ReplicaState``) and status document.
  Its load is reported in work (``proxy/fleet/load.py``) at the instant of the snapshot, queued prefill priced
  at the replica's current learned rate (``pricing``: the gateway passes the router's rate book), with
  other gateways' load on it added (``remote``, ``proxy/sync/state_sync.py``).
- ``Lease``: each routed request takes one on a ``proxy.fleet.load.Work``: queued prefill work (tokens and
  predicted seconds) until its first byte arrives, then a decoding slot; ``release`` (in the handler's
  ``finally``) undoes whatever is left, exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.fleet.load import DEFAULT_WINDOW_S, LoadView, ReplicaLoad, TrafficEpoch, Work, combined
from proxy.fleet.replica_info import ReplicaInfo
from proxy.fleet.roles import Role, role_of
from proxy.upstream.breaker import Breaker, BreakerPolicy
from routing.tiers import tier_warnings
from routing.types import ReplicaId, ReplicaState

Pricing = Callable[[ReplicaId], float]  # a replica's current seconds per prefill token (0: unknown)


class Replica:
    """Mutable runtime record of one replica (owned by the Fleet; snapshots are ReplicaState)."""

    __slots__ = (
        "bootstrap_override", "breaker", "declared_role", "draining", "failures", "healthy", "id", "info",
        "info_stale", "last_error", "load", "pricing", "remote", "running_reserve",
    )  # fmt: skip

    def __init__(
        self,
        url: str,
        window_s: float = DEFAULT_WINDOW_S,
        epoch: TrafficEpoch | None = None,
        breaker: BreakerPolicy | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self.id: ReplicaId = url.rstrip("/")
        self.pricing = pricing or _unpriced  # its current seconds per prefill token (proxy/fleet/load.py)
        self.info: ReplicaInfo | None = None
        self.info_stale = False  # read its info at the next check (its KV publisher came back)
        self.healthy = False
        self.draining = False
        self.failures = 0
        self.load = ReplicaLoad(window_s, epoch or TrafficEpoch())
        self.remote: LoadView | None = None  # other gateways' load on it (proxy/sync/state_sync.py)
        self.running_reserve = 1.0  # its sglang:new_token_ratio, once scraped (proxy/fleet/load.py)
        self.last_error: str | None = None
        self.breaker = Breaker(breaker)
        self.declared_role: Role | None = None  # --prefill / --decode (--backend: None)
        self.bootstrap_override: int | None = None  # --prefill-bootstrap-port for this prefill

    @property
    def role(self) -> Role:
        """unified, prefill or decode: what it reports, else what was declared (``proxy/fleet/roles.py``)."""
        return role_of(self.declared_role, self.info.disaggregation_mode if self.info else None)[0]

    @property
    def role_conflict(self) -> str | None:
        """Why its reported mode contradicts its declared role (it is kept out of the pool), or None."""
        return role_of(self.declared_role, self.info.disaggregation_mode if self.info else None)[1]

    @property
    def bootstrap_port(self) -> int | None:
        """A prefill's bootstrap port: the configured one, else the one it reports; None: neither (the
        decode then uses its own default, as SGLang does with a null port)."""
        if self.bootstrap_override is not None:
            return self.bootstrap_override
        return self.info.bootstrap_port if self.info and self.info.bootstrap_port > 0 else None

    @property
    def inflight_requests(self) -> int:
        return len(self.load.queue) + len(self.load.decoding)

    def state(self, now: float | None = None) -> ReplicaState:
        i = self.info
        now = time.monotonic() if now is None else now
        running, pool = (i.max_running_requests, i.gpu_tokens) if i else (0, 0)
        load = self.load.view(now, running, self.pricing(self.id), pool, self.running_reserve)
        if self.remote is not None:
            load = combined(load, self.remote)
        return ReplicaState(
            id=self.id,
            healthy=self.healthy and i is not None and self.breaker.admits(now),
            draining=self.draining,
            inflight_requests=load.inflight_requests,
            inflight_prefill_tokens=load.inflight_prefill_tokens,
            inflight_prefill_s=load.inflight_prefill_s,
            decoding=load.decoding,
            kv_tokens=load.kv_tokens,
            arrival_rate=load.arrival_rate,
            utilization=load.utilization,
            gpu_tokens=i.gpu_tokens if i else 0,
            host_tokens=i.host_tokens if i else 0,
            storage_tokens=i.storage_tokens if i else 0,
            page_size=i.page_size if i else 1,
            write_policy=i.write_policy if i else None,
            hybrid=i.hybrid if i else False,
            resume_interval=i.resume_interval if i else 0,
            resume_at_end=i.resume_at_end if i else True,
            max_running_requests=i.max_running_requests if i else 0,
            chunk_tokens=i.chunked_prefill_size if i else 0,
            started_at=i.started_at if i else 0.0,
        )

    def answered(self, now: float) -> str:
        """What it last answered, in a few words, for an operator (its URL is not repeated)."""
        if self.healthy and self.info is not None:
            return "circuit breaker open" if not self.breaker.admits(now) else "healthy"
        error = self.last_error or "no answer yet"
        return error.removeprefix(f"replica {self.id}").lstrip(": ") or error

    def status(self) -> dict[str, Any]:
        i = self.info
        return {
            "id": self.id,
            "healthy": self.healthy,
            "draining": self.draining,
            "model": i.served_model if i else None,
            "role": self.role,
            "bootstrap_port": self.bootstrap_port if self.role == "prefill" else None,
            "inflight_requests": self.inflight_requests,
            "inflight_prefill_tokens": self.load.queued_tokens,
            "inflight_kv_tokens": self.load.held(self.running_reserve),
            "running_reserve": self.running_reserve,
            "gpu_tokens": i.gpu_tokens if i else None,
            "host_tokens": i.host_tokens if i else None,
            "page_size": i.page_size if i else None,
            "write_policy": i.write_policy if i else None,
            "hybrid": i.hybrid if i else None,
            "started_at": i.started_at if i else None,
            "last_error": self.last_error,
            "breaker": self.breaker.status(time.monotonic()),
            "warnings": list(tier_warnings(self.state())) if i and self.role != "decode" else [],
        }


def _unpriced(replica: ReplicaId) -> float:
    """No current rate: queued work keeps the price it was routed with."""
    return 0.0


def nothing() -> None:
    """The default change hook: nobody is told."""


class Lease:
    """One request's share of a replica's load; ``first_token`` and ``release`` are idempotent. Every
    change calls ``changed`` (the shared-state publisher's kick, ``proxy/sync/state_sync.py``)."""

    __slots__ = ("changed", "replica", "work")

    def __init__(self, replica: Replica, work: Work, changed: Callable[[], None] = nothing) -> None:
        self.replica, self.work, self.changed = replica, work, changed
        replica.load.add(work)

    def first_token(self) -> None:
        self.replica.load.first_token(self.work, time.monotonic())
        self.changed()

    def release(self) -> None:
        self.replica.load.release(self.work, time.monotonic())
        self.changed()
