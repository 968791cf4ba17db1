"""Replicas from DNS: ``--discover dns://NAME:PORT`` and ``--discover dns+srv://_PORT._PROTO.NAME``.

What a target means (each resolved every ``discover_interval`` seconds, all targets at once):

- ``dns://NAME:PORT``: the A and AAAA records of NAME (asked together); address ``a`` is the replica
  ``http://a:PORT`` (``http://[a]:PORT`` for IPv6). A Kubernetes headless Service lists its ready pods
  this way.
- ``dns+srv://_PORT._PROTO.NAME``: the SRV records; ``(target, port)`` is the replica
  ``http://target:port``. The target's *name* is kept, not its address: a StatefulSet pod keeps its
  identity across restarts, so its new start time tells the fleet it restarted (GPU and host tiers are
  dropped, the storage tier is kept) instead of a new replica replacing an unknown one. The name is
  resolved when connecting, by the system resolver (``--dns-server`` changes only where discovery asks).

An answer that the name does not exist (NXDOMAIN) or has no records of the type is an answer: no
replicas. A failed lookup (time-out, SERVFAIL, no server) is not: that target keeps its last known set,
and the failure is logged at once, then at most every ``proxy.fleet.health_log.REPEAT_S`` seconds with a
count, and the recovery once.

Reconciling (``wanted`` = the union over targets; only replicas that discovery itself added are ever
drained or removed, never those from ``--backend`` or the admin API):

- a wanted replica that the fleet lacks is added and checked at once (``/health`` + server info), so it
  serves as soon as it answers; one that discovery was draining is taken back (undrained);
- a replica that discovery added and that is no longer wanted is drained (no new requests) and removed
  once it has no request in flight, or ``drain_timeout`` seconds after it left, whichever comes first.
  Draining replicas are swept every ``SWEEP_S`` seconds, so removal follows the last request closely.

Resolution never blocks a request: it runs in a background task and uses dnspython's asyncio resolver
(``dns.asyncresolver``: non-blocking sockets on the event loop; A, AAAA and SRV; the system's
resolv.conf with its search domains and ndots, as Kubernetes pods need, or one server given with
``--dns-server HOST[:PORT]``). The ``Resolver`` protocol is the seam: anything with ``addresses`` and
``services`` will do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver
from aiohttp import web
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA
from dns.rdtypes.IN.SRV import SRV

from proxy.config.targets import Target, parse_dns_server, parse_target
from proxy.fleet.fleet import Fleet
from proxy.fleet.health_log import Outage
from proxy.upstream.client import Upstream

if TYPE_CHECKING:
    from proxy.config.settings import Settings

log = logging.getLogger("kvroute.discovery")
SWEEP_S = 1.0
LOOKUP_TIMEOUT_S = 3.0


class ResolveError(Exception):
    """A lookup that failed (no answer at all); the target keeps its last known replicas."""


def replica_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Resolver(Protocol):
    async def addresses(self, name: str) -> list[str]: ...
    async def services(self, name: str) -> list[tuple[str, int]]: ...


class DnsResolver:
    """dnspython's asyncio resolver: the system configuration, or one server (``HOST[:PORT]``)."""

    def __init__(self, server: str | None = None, timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
        try:
            self._r = dns.asyncresolver.Resolver(configure=server is None)
        except dns.exception.DNSException as e:
            raise ValueError(f"cannot read the system's DNS configuration ({e}): give --dns-server") from e
        if server is not None:
            host, port = parse_dns_server(server)
            self._r.nameservers, self._r.port = [host], port
        self._r.lifetime = timeout_s

    async def _query(self, name: str, rdtype: dns.rdatatype.RdataType) -> list[object]:
        """The records of one type; [] when the name does not exist or has none of them."""
        try:
            answer = await self._r.resolve(name, rdtype, search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as e:
            raise ResolveError(f"{rdtype.name} {name}: {type(e).__name__}: {e}") from None
        return list(answer)

    async def addresses(self, name: str) -> list[str]:
        a, aaaa = await asyncio.gather(
            self._query(name, dns.rdatatype.A), self._query(name, dns.rdatatype.AAAA)
        )
        return [r.address for r in [*a, *aaaa] if isinstance(r, A | AAAA)]

    async def services(self, name: str) -> list[tuple[str, int]]:
        records = await self._query(name, dns.rdatatype.SRV)
        return [(r.target.to_text(omit_final_dot=True), r.port) for r in records if isinstance(r, SRV)]


@dataclass(slots=True)
class _TargetState:
    urls: frozenset[str] = frozenset()
    failing: Outage | None = None
    resolved: bool = False


@dataclass(slots=True)
class Discovery:
    """The replica source of one gateway: resolves its targets and reconciles the fleet with them."""

    targets: tuple[Target, ...]
    fleet: Fleet
    resolver: Resolver
    interval_s: float = 5.0
    drain_timeout_s: float = 300.0
    owned: set[str] = field(default_factory=set)  # replicas discovery added
    draining: dict[str, float] = field(default_factory=dict)  # url -> monotonic removal deadline
    _states: dict[Target, _TargetState] = field(default_factory=dict)

    async def resolve(self, target: Target) -> frozenset[str]:
        if target.scheme == "dns+srv":
            return frozenset(replica_url(h, p) for h, p in await self.resolver.services(target.name))
        assert target.port is not None
        return frozenset(replica_url(a, target.port) for a in await self.resolver.addresses(target.name))

    async def refresh(self, upstream: Upstream) -> None:
        """Resolve every target (a failed one keeps its last set), then reconcile the fleet."""
        results = await asyncio.gather(*(self.resolve(t) for t in self.targets), return_exceptions=True)
        for target, result in zip(self.targets, results, strict=True):
            state = self._states.setdefault(target, _TargetState())
            if isinstance(result, ResolveError):
                self._failed(target, state, str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                self._answered(target, state, result)
        await self.reconcile(upstream, frozenset().union(*(s.urls for s in self._states.values())))

    async def reconcile(self, upstream: Upstream, wanted: frozenset[str]) -> None:
        new = sorted(u for u in wanted if self.fleet.get(u) is None)
        for url in sorted(wanted & self.draining.keys()):
            del self.draining[url]
            self.fleet.drain(url, False)
            log.info("discovery: replica %s is back: no longer draining", url)
        for url in sorted((self.owned - wanted) - self.draining.keys()):
            self.draining[url] = time.monotonic() + self.drain_timeout_s
            self.fleet.drain(url, True)
            log.info("discovery: replica %s left: draining (removed when idle)", url)
        for url in new:
            self.owned.add(url)
            log.info("discovery: replica %s appeared: adding it", url)
        replicas = [self.fleet.add(url) for url in new]
        await asyncio.gather(*(self.fleet.check(upstream, r, refresh=True) for r in replicas))
        self.sweep()

    def sweep(self, now: float | None = None) -> None:
        """Remove draining replicas that are idle or past their deadline."""
        now = time.monotonic() if now is None else now
        for url, deadline in list(self.draining.items()):
            replica = self.fleet.get(url)
            inflight = replica.inflight_requests if replica is not None else 0
            if inflight and now < deadline:
                continue
            del self.draining[url]
            self.owned.discard(url)
            self.fleet.remove(url)
            why = "its last request finished" if not inflight else f"{inflight} requests still in flight"
            log.info("discovery: replica %s removed (%s)", url, why)

    def _answered(self, target: Target, state: _TargetState, urls: frozenset[str]) -> None:
        if state.failing is not None:
            log.info("discovery: %s resolves again after %.0fs", target, state.failing.seconds())
        if not urls and (state.urls or not state.resolved):
            log.warning("discovery: %s has no replicas (no such name, or no records)", target)
        state.urls, state.failing, state.resolved = urls, None, True

    def _failed(self, target: Target, state: _TargetState, reason: str) -> None:
        if state.failing is None:
            state.failing = Outage.begin()
            log.warning(
                "discovery: cannot resolve %s, keeping its %d replicas: %s", target, len(state.urls), reason
            )
        elif due := state.failing.again():
            log.warning(
                "discovery: %s still unresolvable after %.0fs (%d more failures): %s", target, *due, reason
            )

    async def run(self, upstream: Upstream) -> None:
        """Re-resolve every ``interval_s``, sweep every ``SWEEP_S``; runs until cancelled."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(min(SWEEP_S, self.interval_s, max(0.0, due - loop.time())))
            try:
                if loop.time() >= due:
                    due = loop.time() + self.interval_s
                    await self.refresh(upstream)
                self.sweep()
            except Exception:  # a bug must not end discovery: log it, try again next time
                log.exception("discovery: refresh failed")


def discovery_for(settings: Settings, fleet: Fleet) -> Discovery:
    """The Discovery of ``settings.discover`` (ValueError when the system's DNS configuration is missing)."""
    targets = tuple(dict.fromkeys(parse_target(u) for u in settings.discover))
    resolver = DnsResolver(settings.dns_server)
    return Discovery(targets, fleet, resolver, settings.discover_interval, settings.discover_drain_timeout)


DISCOVERY: web.AppKey[Discovery] = web.AppKey("discovery", Discovery)
