"""kvroute's routing in the simulator, fed exactly as the gateway feeds it, with no sockets.

``GatewaySystem`` holds a real ``routing.router.Router`` (the policy under test, every other setting at
the gateway's defaults) and, per replica, the gateway's own record of it: a ``proxy.fleet.replica.Replica``
(health, draining, the info from ``/get_server_info``, and its ``proxy.fleet.load.ReplicaLoad``, which is
pure). What the I/O-bound proxy code does around them is mirrored here, bookkeeping for bookkeeping:

- ``joined`` mirrors ``proxy/fleet/fleet.py`` adding a replica whose health check passed and whose server
  info was read: a ``Replica`` on the fleet's shared ``TrafficEpoch``, priced at the Router's learned
  prefill rate (the ``pricing`` ``proxy/server.py`` passes), info parsed by
  ``proxy.fleet.replica_info.parse_replica_info`` from the emulator's own server-info body, healthy;
  ``draining`` is the admin API's drain, ``removed`` the fleet's removal (``Router.forget``);
- ``route`` mirrors ``proxy/context.py`` ``Gateway.route`` and ``proxy/dispatch/attempt.py`` ``Attempt``'s
  start: the snapshot (``Fleet.snapshot``: every member's ``Replica.state(now)``, in membership order),
  ``Router.route``, then the load lease: the ``proxy.fleet.load.Work`` that ``proxy/dispatch/attempt.py``
  ``_work`` builds from the ticket's prediction (streamed, with its first-byte deadline from the default
  ``proxy.upstream.deadlines.Deadlines``), added to the replica's load (``proxy.fleet.replica.Lease``);
- ``first_token`` is ``Attempt.first_byte`` (the lease's ``first_token``) and ``finish`` is
  ``Attempt.finish``: the lease released, then ``Router.finish(ticket, Report(...))`` with the
  replica's usage (prompt, cached and completion tokens), the observed TTFT (first byte - send) and
  the decode time.

Not mirrored, because nothing in a simulated run exercises them: retries (no replica fails), the
circuit breaker, admission's per-replica waiting bound (a 429 when every replica holds 60 s of queued
prefill), health flaps, the scraper (the emulator reports ``new_token_ratio`` 1.0, the default reserve).
Times are virtual (the loop's clock) wherever the proxy reads ``time.monotonic``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.sim.jobs import Job
from bench.sim.replica import SimReplica
from bench.sim.system import Outcome, Routed
from proxy.fleet.load import TrafficEpoch, Work
from proxy.fleet.replica import Replica
from proxy.upstream.deadlines import Deadlines
from routing.config import PolicyName, RoutingConfig
from routing.ledger import Ticket
from routing.router import Router
from routing.ttft import kv_need
from routing.types import Report


@dataclass(slots=True)
class _Lease:
    ticket: Ticket
    work: Work
    replica: Replica


class GatewaySystem:
    """A kvroute gateway with one routing policy (module docstring)."""

    def __init__(self, policy: PolicyName) -> None:
        self.name: str = policy
        self.router = Router(RoutingConfig(policy=policy))
        self.deadlines = Deadlines()
        self._epoch = TrafficEpoch()
        self._replicas: dict[str, Replica] = {}

    def _price(self, replica: str) -> float:
        return 1.0 / self.router.rates.get(replica).prefill_tokens_per_s

    def joined(self, replica: SimReplica) -> None:
        record = Replica(replica.id, epoch=self._epoch, pricing=self._price)
        record.info = replica.info()
        record.healthy = True
        self._replicas[record.id] = record

    def draining(self, replica_id: str) -> None:
        self._replicas[replica_id].draining = True

    def removed(self, replica_id: str) -> None:
        if self._replicas.pop(replica_id, None) is not None:
            self.router.forget(replica_id)

    def route(self, job: Job, now: float) -> Routed:
        states = [r.state(now) for r in self._replicas.values()]
        ticket = self.router.route(job.request, states)
        replica = self._replicas[ticket.replica]
        work = self._work(ticket, now)
        replica.load.add(work)
        return Routed(ticket.replica, _Lease(ticket, work, replica))

    def _work(self, ticket: Ticket, now: float) -> Work:
        """``proxy/dispatch/attempt.py`` ``_work`` for a streamed request sent at ``now``."""
        terms = ticket.prediction.terms
        default_tokens = self.router.cfg.default_new_tokens
        return Work(
            sent_s=now,
            prefill_tokens=max(0, round(terms.uncached_tokens)),
            work_s=terms.prefill_s + terms.reload_s,
            ttft_s=terms.total,
            budget=ticket.request.max_new_tokens or 0,
            streamed=True,
            overhead_s=terms.overhead_s,
            reload_s=terms.reload_s,
            kv_tokens=round(kv_need(ticket.request, terms.uncached_tokens, default_tokens)),
            first_byte_s=self.deadlines.first_byte_s(terms.total, True, ticket.request.max_new_tokens),
        )

    def first_token(self, routed: Routed, now: float) -> None:
        lease: _Lease = routed.state
        lease.replica.load.first_token(lease.work, now)

    def finish(self, routed: Routed, outcome: Outcome, now: float) -> None:
        lease: _Lease = routed.state
        lease.replica.load.release(lease.work, now)
        o = outcome
        report = Report(o.ok, o.prompt_tokens, o.cached_tokens, o.ttft_s, o.completion_tokens, o.decode_s)
        self.router.finish(lease.ticket, report)
