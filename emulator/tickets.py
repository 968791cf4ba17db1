"""What flows between the HTTP handlers and the engine: requests, their tickets and their events.

A handler submits a `Work` (prompt ids + the predetermined output of every choice) and gets a `Ticket`;
the engine reports on the ticket's queue, in order: `Prefilled` (admitted: cached tokens per tier and the
modelled queue wait), `Emitted` (tokens so far per choice, after each decode step), then `Finished` or
`Failed`. `Prediction` is the debug oracle's answer; `EngineListener` is where metrics are counted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from emulator.radix import Admission


@dataclass(frozen=True, slots=True)
class Work:
    """A generation request as the engine sees it: prompt ids and the predetermined output of each choice."""

    rid: str
    prompt: tuple[int, ...]
    extra_key: str | None
    outputs: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Prefilled:
    cached_tokens: int
    device: int
    host: int
    storage: int
    queue_s: float  # modelled seconds waited before admission
    arrival_cached: int = 0  # what the cache held of the prompt when the request arrived (all tiers)


@dataclass(frozen=True, slots=True)
class Emitted:
    counts: tuple[int, ...]  # tokens emitted so far per choice


@dataclass(frozen=True, slots=True)
class Finished:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    message: str
    status: int = 500


Event = Prefilled | Emitted | Finished | Failed


@dataclass(frozen=True, slots=True)
class Prediction:
    prompt_tokens: int
    gpu_tokens: int
    host_tokens: int
    storage_tokens: int
    queue_s: float
    ttft_s: float


class EngineListener(Protocol):
    """Where the engine reports what Prometheus (metrics.py) counts."""

    def on_admit(self, queue_s: float, prefilled: Prefilled, prompt_tokens: int) -> None: ...
    def on_step(self, hit_tokens: int, new_tokens: int) -> None: ...
    def on_tokens(self, count: int) -> None: ...


@dataclass(eq=False, slots=True)
class Ticket:
    """One in-flight request (mutable engine state; handlers read `events`)."""

    work: Work
    arrival: float
    est_prefill_s: float = 0.0  # modelled prefill + load seconds, from the cache on arrival (submit)
    arrival_cached: int = 0  # prompt tokens the cache held (GPU + host + storage) when it arrived
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    admission: Admission | None = None
    pos: int = 0
    load_s: float = 0.0
    done: bool = False
    decode_task: asyncio.Task[None] | None = None
    blocked: bool = False  # admission was refused once (slots or memory): it waited for a release
    ready: float = 0.0  # loop time from which the engine could serve it (arrival, or a release)
    # PD decode (pd_runs.py): the prompt's KV comes from a prefill server instead of being computed; the
    # first token is sent when this resolves (the KV arrived)
    kv_arrival: asyncio.Future[None] | None = None


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_running_requests: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    time_scale: float
    share_prefixes: bool = True  # False with --disable-radix-cache
    page_size: int = 1  # a new chunked request's first chunk is floored to whole pages
