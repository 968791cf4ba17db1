"""What every workload generator builds on: the fleet shape, the request, outage and workload types,
the request builder and the output lengths.

A `Workload` is a tuple of `TimedRequest`s (times in *modelled* seconds) plus how to replay it; see
bench/workloads/generators.py for the generators and what open and closed loop mean.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.workloads.text import estimate_tokens

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "default"
OUTPUT_MIN, OUTPUT_MAX = 32, 512


@dataclass(frozen=True, slots=True)
class FleetShape:
    """What the workloads are sized against: per-replica pools in tokens."""

    replicas: int
    gpu_tokens: int
    host_tokens: int

    @property
    def fleet_gpu(self) -> int:
        return self.replicas * self.gpu_tokens

    @property
    def fleet_total(self) -> int:
        return self.replicas * (self.gpu_tokens + self.host_tokens)


@dataclass(frozen=True, slots=True)
class TimedRequest:
    index: int
    arrival_s: float
    session: str
    path: str
    body: Mapping[str, Any] = field(hash=False, compare=True)
    expected_prompt_tokens: int
    tag: str
    after: int | None = None
    think_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Outage:
    """A timed fleet event: the replica at index `replica` of the fleet's URLs is killed at `at_frac` of
    the workload's arrival span after its first arrival, and comes back `down_s` modelled seconds later
    with an empty GPU and host cache, storage kept (the emulator's restart fault with `down_s`; injected
    by bench/runs/outages.py). A fraction of the span, so it moves with bench.workloads.load's rescaling
    of the arrivals; the down time is not rescaled."""

    at_frac: float
    replica: int
    down_s: float


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    requests: tuple[TimedRequest, ...]
    sessions: bool = False  # send `x-session-id` (real multi-turn sessions only)
    time_scale: float = 0.2  # default wall seconds per modelled second (keeps the fleet's CPU load modest)
    sweep: bool = False  # open loop: arrivals can be rescaled to an offered load (bench.workloads.load)
    outages: tuple[Outage, ...] = ()  # replicas killed and brought back during the replay

    @property
    def prompt_tokens(self) -> int:
        return sum(r.expected_prompt_tokens for r in self.requests)


def output_tokens(rng: random.Random) -> int:
    """A log-uniform length in [OUTPUT_MIN, OUTPUT_MAX]: exp(uniform(ln min, ln max)), rounded."""
    return round(math.exp(rng.uniform(math.log(OUTPUT_MIN), math.log(OUTPUT_MAX))))


def chat(messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **extra}


def tokens_of(messages: list[dict[str, Any]]) -> int:
    return sum(estimate_tokens(str(m.get("content", ""))) + 5 for m in messages) + 3


class Builder:
    """Accumulates requests with consecutive indexes."""

    def __init__(self) -> None:
        self.items: list[TimedRequest] = []

    def add(
        self, arrival: float, session: str, body: dict[str, Any], tokens: int, tag: str, **kw: Any
    ) -> int:
        index = len(self.items)
        path = CHAT if "messages" in body else COMPLETIONS
        self.items.append(TimedRequest(index, arrival, session, path, body, tokens, tag, **kw))
        return index
