"""The fleet: which replicas exist, which are healthy, what each holds and how loaded it is.

- Replicas come from settings (``--backend``) and the admin API (add, remove, drain).
- A replica joins the pool once ``/health`` answers 200 *and* ``/get_server_info`` (+ ``/get_model_info``)
  was read (served model, KV capacity, page size, HiCache settings, hybrid, start time). Info is
  re-read every ``INFO_REFRESH_CHECKS`` health checks and whenever a replica comes back.
- Active health checks every ``health_interval``: ``FAILURE_THRESHOLD`` consecutive failures take a
  replica out; one success (plus fresh info) brings it back. A request that cannot connect marks the
  replica unhealthy at once (passive check), so traffic moves on without waiting for the poller.
- A restart (``startup_time`` changed, or a return after a health flap from a replica that reports no
  start time, so a restart cannot be ruled out) is told to the restart owner (``proxy/fleet/restarts.py``,
  which decides whether the cache model is reset or the replica's own KV events rebuilt it): the prefix index
  drops its GPU and host tiers and keeps its storage tier. A replica that returns with the same start time
  kept its cache, and nothing is dropped. Removing a replica calls ``on_removed(replica)``.
- Passive checks (``proxy/upstream/breaker.py``): each replica has a circuit breaker fed by the outcomes of
  real requests (``outcome``); an open breaker hides the replica from the router (``state().healthy`` is
  false), a half-open one lets one trial through (``admit``). A good active check closes a half-open
  breaker; a replica that comes back from unhealthy, or restarted, starts with a closed one.
- Roles (``proxy/fleet/roles.py``): in a prefill/decode fleet, ``snapshot`` is what routing chooses a
  prefill from: the prefill servers serving the model (an ordinary, unified replica of a model that
  also has PD servers is left idle, logged once: docs/pd.md); ``decodes`` gives the decode servers. A
  replica whose reported mode contradicts its declared role fails its health checks with the reason. A
  breaker may eject at most half of the replicas *of its role*.
- Load: ``acquire`` gives each routed request a ``Lease`` on its replica's load and ``snapshot`` the
  routing view of every replica serving a model (``proxy/fleet/replica.py``: the replica record, its
  snapshot in work priced at its current learned rate, and the lease).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from proxy.errors import UpstreamError
from proxy.fleet.balance import Balance
from proxy.fleet.health_log import HealthLog
from proxy.fleet.load import TrafficEpoch, Work
from proxy.fleet.replica import Lease, Pricing, Replica, nothing
from proxy.fleet.replica_info import parse_replica_info
from proxy.fleet.restarts import Restarts
from proxy.fleet.roles import Role
from proxy.upstream.breaker import BreakerPolicy
from proxy.upstream.client import Upstream
from proxy.upstream.credentials import ReplicaAuth, replica_id_of
from routing.tiers import tier_warnings
from routing.types import ReplicaId, ReplicaState

log = logging.getLogger("kvroute.fleet")
FAILURE_THRESHOLD = 2
INFO_REFRESH_CHECKS = 12
HEALTH_TIMEOUT_S = 5.0


def _nobody(replica: ReplicaId) -> None:
    pass


class Fleet:
    def __init__(
        self,
        urls: Iterable[str],
        health_interval: float,
        on_removed: Callable[[ReplicaId], None],
        restarts: Restarts,
        breaker: BreakerPolicy | None = None,
        pricing: Pricing | None = None,
        auth: ReplicaAuth | None = None,
    ) -> None:
        self._replicas: dict[ReplicaId, Replica] = {}
        self.auth = auth or ReplicaAuth()  # credentials per replica id (``proxy/upstream/credentials.py``)
        self._breaker = breaker
        self._pricing = pricing
        self._interval = health_interval
        self._on_removed = on_removed
        self.restarts = restarts  # the one owner of "this replica restarted"
        self._health = HealthLog(health_interval)
        self._checks = 0
        self._idle: set[ReplicaId] = set()  # unified replicas left idle beside PD servers (logged once)
        self._epoch = TrafficEpoch()  # the replicas' load averages start with the fleet's traffic
        self.load_changed: Callable[[], None] = nothing  # called when a lease's load changes
        self.balance = Balance()  # idle-while-queued seconds per replica (proxy/fleet/balance.py)
        self._changed: dict[ReplicaId, Callable[[], None]] = {}  # per replica: its leases' callback
        self.live_arrived: Callable[[ReplicaId], None] = _nobody  # a live request sent to a replica
        for url in urls:
            self.add(url)

    # ---- membership (admin API) ----
    def add(self, url: str, role: Role | None = None, bootstrap_port: int | None = None) -> Replica:
        """The replica at ``url`` (added when new); its id is the URL without credentials. ``role`` is a
        declared one (``--prefill``, ``--decode``), ``bootstrap_port`` a prefill's configured port."""
        rid = self.auth.register(url)
        replica = self._replicas.get(rid)
        if replica is None:
            replica = Replica(rid, epoch=self._epoch, breaker=self._breaker, pricing=self._pricing)
            self._replicas[replica.id] = replica
            self._changed[replica.id] = functools.partial(self._lease_changed, replica)
        if role is not None:
            replica.declared_role, replica.bootstrap_override = role, bootstrap_port
        return replica

    def remove(self, rid: ReplicaId) -> bool:
        replica = self._replicas.pop(replica_id_of(rid), None)
        if replica is not None:
            self.auth.forget(replica.id)
            self.balance.forget(replica.id)
            del self._changed[replica.id]
            self._on_removed(replica.id)
        return replica is not None

    def drain(self, rid: ReplicaId, draining: bool) -> bool:
        replica = self._replicas.get(replica_id_of(rid))
        if replica is not None:
            replica.draining = draining
        return replica is not None

    def note_scrape(self, replica_id: ReplicaId, gauges: Mapping[str, float]) -> None:
        """A replica's scraped gauges: its ``new_token_ratio`` is the part of their output budget that
        its running requests are charged for memory (``proxy/fleet/load.py``)."""
        r, ratio = self.get(replica_id), gauges.get("new_token_ratio")
        if r is not None and ratio is not None:
            r.running_reserve = min(max(ratio, 0.0), 1.0)

    def get(self, rid: ReplicaId) -> Replica | None:
        return self._replicas.get(rid) or self._replicas.get(replica_id_of(rid))

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def answers(self, shown: int = 8) -> str:
        """What each replica last answered (``URL (reason)``, the first ``shown``), for error messages and
        the start-up line that waits for a healthy replica."""
        now, replicas = time.monotonic(), self.replicas()
        parts = [f"{r.id} ({r.answered(now)})" for r in replicas[:shown]]
        more = f" and {len(replicas) - shown} more" if len(replicas) > shown else ""
        return ", ".join(parts) + more if parts else "no replica configured"

    # ---- routing inputs ----
    def models(self) -> set[str]:
        return {r.info.served_model for r in self._replicas.values() if r.info is not None}

    def serves(self, replica: Replica, model: str | None) -> bool:
        if model is None or replica.info is None:
            return replica.info is not None
        served = replica.info.served_model
        return model == served or model.split(":", 1)[0] == served

    def snapshot(self, model: str | None) -> list[ReplicaState]:
        """States of the replicas that take the prefill of a request for ``model`` (any model when None),
        all at one instant: the unified replicas, or in a prefill/decode fleet its prefill servers."""
        now = time.monotonic()
        serving = [r for r in self._replicas.values() if self.serves(r, model)]
        role = "prefill" if any(r.role != "unified" for r in serving) else "unified"
        return [r.state(now) for r in serving if r.role == role]

    def decodes(self, model: str | None) -> list[ReplicaState]:
        """States of the decode servers that serve ``model``, all at one instant."""
        now = time.monotonic()
        return [r.state(now) for r in self._replicas.values() if r.role == "decode" and self.serves(r, model)]

    def role(self, replica_id: ReplicaId) -> Role | None:
        replica = self._replicas.get(replica_id)
        return replica.role if replica is not None else None

    def serving(self) -> bool:
        """Can a request be served now: a healthy unified replica, or a healthy prefill and decode server."""
        healthy = {r.role for r in self._replicas.values() if r.healthy and r.info is not None}
        return "unified" in healthy or {"prefill", "decode"} <= healthy

    def idle_unified(self) -> list[ReplicaId]:
        """Unified replicas of a model that also has prefill/decode servers: never routed (docs/pd.md)."""
        pd_models = {r.info.served_model for r in self._replicas.values() if r.info and r.role != "unified"}
        return [
            r.id
            for r in self._replicas.values()
            if r.info and r.role == "unified" and r.info.served_model in pd_models
        ]

    def acquire(self, replica_id: ReplicaId, work: Work) -> Lease:
        changed = self._changed[replica_id]
        lease = Lease(self._replicas[replica_id], work, changed)
        changed()
        if work.live:
            self.live_arrived(replica_id)  # the warm-up worker preempts its step there
        return lease

    def _lease_changed(self, replica: Replica) -> None:
        self.balance.changed(replica, time.monotonic())
        self.load_changed()

    def admits(self, replica_id: ReplicaId) -> bool:
        """Would ``admit`` let a request through now (without claiming a half-open trial)?"""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.breaker.admits(time.monotonic())

    def admit(self, replica_id: ReplicaId) -> bool:
        """May a request be sent to the replica now (its breaker closed, or this is its half-open trial)?"""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.breaker.acquire(time.monotonic())

    def outcome(self, replica_id: ReplicaId, ok: bool | None, reason: str = "") -> None:
        """What an attempt met: a good answer (True), a failure (False) or no verdict (None)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        b = replica.breaker
        if ok is None:
            b.release()
        elif ok:
            b.success()
        elif b.failure(time.monotonic(), may_trip=self._may_eject(replica.role)):
            log.warning("replica %s: circuit breaker open after %s (trip %d)", replica_id, reason, b.streak)
            replica.last_error = reason

    def _may_eject(self, role: Role) -> bool:
        """Another breaker may open while at most half of the replicas of ``role`` are ejected and one is
        left (a PD fleet needs both a prefill and a decode server)."""
        now = time.monotonic()
        peers = [r for r in self._replicas.values() if r.role == role]
        ejected = sum(not r.breaker.admits(now) for r in peers)
        return ejected + 1 <= len(peers) // 2

    def mark_unreachable(self, replica_id: ReplicaId, reason: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is not None and replica.healthy:
            self._health.failed(replica_id, reason, was_healthy=True)
            replica.healthy = False
            replica.failures = FAILURE_THRESHOLD
            replica.last_error = reason

    # ---- active checks ----
    async def check_all(self, upstream: Upstream) -> None:
        refresh = self._checks % INFO_REFRESH_CHECKS == 0
        self._checks += 1
        await asyncio.gather(*(self.check(upstream, r, refresh) for r in list(self._replicas.values())))
        self._health.fleet(sum(r.healthy for r in self._replicas.values()), len(self._replicas))
        self.balance.refresh(self._replicas.values(), time.monotonic())  # health changes no lease reports
        idle = set(self.idle_unified())
        for rid in sorted(idle - self._idle):
            log.warning("replica %s: a unified replica beside prefill/decode servers of its model is not "
                        "routed (mixed fleets: docs/pd.md)", rid)  # fmt: skip
        self._idle = idle

    async def check(self, upstream: Upstream, replica: Replica, refresh: bool = False) -> None:
        try:
            status, _ = await upstream.call(replica.id, "GET", "/health", HEALTH_TIMEOUT_S)
            if status != 200:
                raise UpstreamError(f"/health returned HTTP {status}")
            if refresh or replica.info is None or not replica.healthy or replica.info_stale:
                await self._refresh_info(upstream, replica)
                replica.info_stale = False
            if (conflict := replica.role_conflict) is not None:
                raise UpstreamError(conflict)
        except UpstreamError as e:
            self._failed(replica, e.message)
            return
        if not replica.healthy:
            self._health.recovered(replica.id, replica.info.served_model if replica.info else "?")
            replica.breaker.reset()
        else:
            replica.breaker.probe_ok(time.monotonic())
        replica.healthy, replica.failures, replica.last_error = True, 0, None

    async def _refresh_info(self, upstream: Upstream, replica: Replica) -> None:
        info = await upstream.get_json(replica.id, "/get_server_info", HEALTH_TIMEOUT_S)
        if not isinstance(info, dict):
            raise UpstreamError("/get_server_info is not a JSON object")
        try:  # best effort: only the hybrid flag comes from here
            model_info = await upstream.get_json(replica.id, "/get_model_info", HEALTH_TIMEOUT_S)
        except UpstreamError:
            model_info = {}
        new = parse_replica_info(info, model_info if isinstance(model_info, dict) else {})
        old, replica.info = replica.info, new
        if old != new and replica.role != "decode":  # a decode server runs no radix cache, no HiCache
            for warning in tier_warnings(replica.state()):
                log.warning("replica %s: %s", replica.id, warning)
        if old is None:
            return
        if old.started_at and new.started_at and old.started_at != new.started_at:
            replica.breaker.reset()
            self.restarts.started(replica.id)
        elif not replica.healthy and not (old.started_at and new.started_at):
            self.restarts.returned_unknown(replica.id)

    def _failed(self, replica: Replica, reason: str) -> None:
        """A failed check: logged (``proxy.fleet.health_log``); a healthy replica leaves the pool after
        ``FAILURE_THRESHOLD`` in a row."""
        replica.failures += 1
        replica.last_error = reason
        if not replica.healthy or replica.failures >= FAILURE_THRESHOLD:
            self._health.failed(replica.id, reason, was_healthy=replica.healthy)
            replica.healthy = False

    async def run(self, upstream: Upstream) -> None:
        """The health/info poller; runs until cancelled."""
        while True:
            await self.check_all(upstream)
            await asyncio.sleep(self._interval)
