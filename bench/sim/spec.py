"""What a simulated scenario is made of: the fleet (replicas, their changes) and the requests.

A ``Scenario`` is a pure value, drawn from a seed by ``bench.sim.scenarios``: every system in the
simulator replays exactly the same one.

- ``ReplicaSpec``: one emulated replica: its speed (1.0 = the profile's timing; 0.5 = every step, load
  and decode token takes twice as long: the emulator's slow factor 1 / speed), its GPU KV pool in tokens,
  its host pool as a multiple of the GPU pool (HiCache write_back; 0 = HiCache off), and whether it is
  in the fleet from the start.
- ``FleetChange``: at ``at_s`` (modelled seconds) a replica joins (``add``: empty caches) or leaves
  (``remove``: it is drained first, as an operator scales down: no new requests, the ones in flight
  finish, then it is gone).
- ``SimRequest``: one chat or completions body (as the client sends it), when it arrives (open loop) or
  after which request and how long after that one's answer ends (closed loop: a session's next turn),
  and the session header it carries (``x-session-id``), if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ChangeKind = Literal["add", "remove"]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    name: str  # its ReplicaId (a base URL; nothing ever connects to it)
    speed: float = 1.0
    gpu_tokens: int = 48_000
    host_ratio: float = 2.0  # host pool = ratio x GPU pool (HiCache write_back); 0 = HiCache off
    at_start: bool = True  # False: it joins later (a FleetChange "add")

    @property
    def hicache(self) -> bool:
        return self.host_ratio > 0


@dataclass(frozen=True, slots=True)
class FleetChange:
    at_s: float
    kind: ChangeKind
    replica: str


@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    arrival_s: float  # open loop: when it arrives; closed loop: ignored (see `after`)
    path: str  # /v1/chat/completions or /v1/completions
    body: Mapping[str, Any] = field(hash=False)
    tag: str  # what kind of request it is (rag-first, rag-repeat, session, burst, chat, ...)
    session: str | None = None  # the x-session-id header it carries; None: no header
    after: int | None = None  # closed loop: it is sent think_s after this request's answer ended
    think_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int
    kind: str  # the components it mixes, e.g. "rag+sessions+burst"
    profile: str  # the emulator's timing profile (emulator/timing.py)
    load: float  # the offered load its arrivals were scaled to (bench/workloads/load.py)
    replicas: tuple[ReplicaSpec, ...]
    changes: tuple[FleetChange, ...]
    requests: tuple[SimRequest, ...]
    page_size: int = 16
    max_running_requests: int = 32

    def spec(self, name: str) -> ReplicaSpec:
        return next(r for r in self.replicas if r.name == name)

    def describe(self) -> str:
        speeds = ",".join(f"{r.speed:g}" for r in self.replicas)
        gpus = ",".join(f"{r.gpu_tokens // 1000}K" for r in self.replicas)
        moves = " ".join(f"{c.kind}@{c.at_s:.0f}s" for c in self.changes)
        return (
            f"seed {self.seed}: {self.kind}, {len(self.replicas)} replicas ({self.profile}; speeds {speeds};"
            f" GPU {gpus}){' ' + moves if moves else ''}, {len(self.requests)} requests, load {self.load:.2f}"
        )


def replica_name(i: int) -> str:
    return f"http://replica-{i:02d}"
