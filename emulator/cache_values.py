"""Value types of the emulated radix cache (``emulator/radix.py``): its shape and what it reports.

- ``CacheConfig``: pool sizes in tokens, page size, write policy, storage tier, hybrid anchor pools.
- ``MatchResult``: a pure peek at the usable prefix, split by tier.
- ``Admission``: what an admitted request reused from each tier, with its ``Lock`` (the mutable handle
  the cache moves while the request inserts what it computed).
- ``CacheStats``: pool usage and cumulative counters for metrics and the debug endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emulator.storage import Storage

if TYPE_CHECKING:
    from emulator.radix_node import Node

WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through", "write_through_selective")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Sizes are in tokens; the pools hold ``tokens // page_size`` pages."""

    gpu_tokens: int
    page_size: int = 1
    hicache: bool = False
    host_tokens: int = 0
    write_policy: str = "write_through"
    storage: Storage | None = None
    load_back_threshold: int = 10
    prefetch_threshold: int = 256
    hybrid: bool = False
    mamba_slots: int = 0
    host_mamba_slots: int = 0
    mamba_track_interval: int = 256
    mamba_extra_buffer: bool = False

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.gpu_tokens < self.page_size:
            raise ValueError("gpu_tokens must hold at least one page")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, not {self.write_policy!r}")
        if self.hybrid and self.mamba_slots < 1:
            raise ValueError("a hybrid cache needs mamba_slots >= 1")
        if self.mamba_track_interval < 1:
            raise ValueError("mamba_track_interval must be >= 1")


@dataclass(frozen=True, slots=True)
class MatchResult:
    """A pure peek: the usable prefix split by tier (what ``admit`` would use right now)."""

    gpu_tokens: int
    host_tokens: int
    storage_tokens: int

    @property
    def total(self) -> int:
        return self.gpu_tokens + self.host_tokens + self.storage_tokens


class Lock:
    """The mutable part of an admission: the locked path's deepest node, the recurrent-state anchor it
    pins (hybrid), its GPU reservation, and the cache generation (a restart voids old locks). The node's
    depth is the prefix the request holds in the tree: the match at admission, then whatever it inserted
    while unfinished (node and anchor move down, the reservation shrinks by the pages inserted)."""

    __slots__ = ("anchor", "generation", "node", "released", "reserved_tokens")

    def __init__(self, node: Node, anchor: Node, reserved_tokens: int, generation: int) -> None:
        self.node = node
        self.anchor = anchor
        self.reserved_tokens = reserved_tokens
        self.generation = generation
        self.released = False


@dataclass(frozen=True, slots=True)
class Admission:
    """One admitted request: what it reused from each tier, and its lock handle (opaque to callers)."""

    gpu_hit_tokens: int
    host_loaded_tokens: int
    storage_loaded_tokens: int
    cached_tokens: int
    lock: Lock = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class CacheStats:
    gpu_capacity: int
    gpu_used: int
    gpu_cached: int
    gpu_evictable: int
    host_capacity: int
    host_used: int
    storage_used: int
    evicted_tokens_total: int
    load_back_tokens_total: int
    backuped_tokens_total: int
    prefetched_tokens_total: int
    host_hit_tokens_total: int
    gpu_hit_tokens_total: int
    storage_hit_tokens_total: int
    mamba_used: int
    mamba_host_used: int
