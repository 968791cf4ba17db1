"""What a routing system is to the simulator: where a request goes, and what it learns back.

The simulator (``bench.sim.simulation``) calls, in virtual time:

- ``joined(replica)`` when a replica enters the fleet (at the start, or a FleetChange "add"),
  ``draining(id)`` when it is being removed (no new requests from then on) and ``removed(id)`` once its
  last request ended;
- ``route(job, now)`` once per request, when it arrives: the replica it is sent to, with whatever the
  system needs to keep about it (a ``Routed``);
- ``first_token(routed, now)`` when the first token comes back (the end of its prefill);
- ``finish(routed, outcome, now)`` when its answer has ended (or failed).

Systems: ``bench.sim.gateway.GatewaySystem`` (kvroute's Router with a policy, fed as the proxy feeds it)
and ``bench.sim.oracle.OracleSystem``. ``SYSTEMS`` names them as ``kvroute bench sim --systems`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bench.sim.jobs import Job
from bench.sim.replica import SimReplica
from routing.config import POLICY_NAMES

POLICIES = POLICY_NAMES  # kvroute's policies (routing/policies/)
SYSTEMS = (*POLICIES, "oracle")
DEFAULT_SYSTEMS = ("cost", "round_robin", "least_load", "cache_aware", "oracle")
KVROUTE = "cost"  # kvroute's default policy: the system every other one is compared with
ORACLE = "oracle"


@dataclass(slots=True)
class Routed:
    replica: str
    state: Any = None  # what the system keeps about the request until it finishes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the replica reported about one request (``proxy/dispatch/attempt.py`` reads the same)."""

    ok: bool
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    completion_tokens: int
    decode_s: float | None


class System(Protocol):
    name: str

    def joined(self, replica: SimReplica) -> None: ...
    def draining(self, replica_id: str) -> None: ...
    def removed(self, replica_id: str) -> None: ...
    def route(self, job: Job, now: float) -> Routed: ...
    def first_token(self, routed: Routed, now: float) -> None: ...
    def finish(self, routed: Routed, outcome: Outcome, now: float) -> None: ...
