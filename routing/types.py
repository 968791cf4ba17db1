"""Value types shared by every routing module and by the proxy that feeds them.

Everything here is a frozen dataclass with slots (or a Protocol, or an alias): the routing library is
pure, so its inputs are snapshots and its outputs are values. Token counts are *estimated* tokens
(prompt characters / chars-per-token) unless a name says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

ReplicaId = str
"""A replica's stable id: its base URL without a trailing slash (``http://127.0.0.1:30001``)."""

BlockHash = int
"""One chained xxh3-64 block hash (see ``routing.hashing``)."""

WritePolicy = Literal["write_back", "write_through", "write_through_selective"]
"""SGLang's ``--hicache-write-policy`` values. A replica without HiCache has ``write_policy=None``."""


class Reason(StrEnum):
    """Why a decision went where it went; every exit path of every policy names one (a metric label)."""

    PREFIX_GPU = "prefix_gpu"  # the longest/cheapest prefix sits in the chosen replica's GPU pool
    PREFIX_HOST = "prefix_host"  # ... in its host pool (HiCache), to be reloaded
    PREFIX_STORAGE = "prefix_storage"  # ... in its storage tier
    LEAST_COST = "least_cost"  # no useful prefix anywhere: the cheapest replica by predicted TTFT
    LEAST_LOAD = "least_load"  # the least-loaded replica (policy least_load, or a balance escape)
    ROUND_ROBIN = "round_robin"
    SESSION = "session"  # session affinity held
    CONSISTENT_HASH = "consistent_hash"
    CACHE_MATCH = "cache_match"  # sglang-style cache_aware: match above its threshold
    BALANCE = "balance"  # sglang-style cache_aware: imbalance escape to least load
    FALLBACK = "fallback"  # the preferred choice was unusable; the next best was taken


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What routing needs to know about one request (never its text)."""

    model: str
    block_hashes: tuple[BlockHash, ...]
    prompt_tokens: int  # estimated prompt tokens
    block_tokens: float  # estimated tokens per full block (chars per block / chars per token)
    session_key: str | None = None  # x-session-id header, else the `user` field
    tenant: str = ""  # cache_salt / tenant salt, already mixed into block_hashes
    max_new_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A snapshot of one replica as the fleet manager sees it at routing time."""

    id: ReplicaId
    healthy: bool = True
    draining: bool = False
    inflight_requests: int = 0
    inflight_prefill_tokens: int = (
        0  # estimated uncached prompt tokens routed there, first token not yet seen
    )
    gpu_tokens: int = 0  # device KV pool capacity (max_total_num_tokens)
    host_tokens: int = 0  # HiCache host pool capacity, 0 when HiCache is off
    storage_tokens: int = 0  # L3 storage capacity, 0 when there is none
    page_size: int = 1
    write_policy: WritePolicy | None = None  # None = HiCache off
    hybrid: bool = False  # hybrid (GDN/Mamba + attention) model
    # hybrid only: engine tokens between recurrent-state resume points, i.e. where a prefix that stops inside
    # a cached sequence can resume (the prefill chunk size, or the mamba track interval with extra_buffer;
    # contract §3.2); 0 = not hybrid: any point resumes
    resume_interval: int = 0
    resume_at_end: bool = True  # hybrid: a served prompt's end is a resume point too (not with extra_buffer)
    max_running_requests: int = 0  # 0 = unknown
    started_at: float = 0.0  # replica start time as reported; a change means a restart


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Leading tokens of the request found on one replica, per tier (disjoint, GPU first)."""

    gpu_tokens: float = 0.0
    host_tokens: float = 0.0
    storage_tokens: float = 0.0

    @property
    def total_tokens(self) -> float:
        return self.gpu_tokens + self.host_tokens + self.storage_tokens


NO_MATCH = PrefixMatch()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica that passed the filters so far, with what the cache model says it holds."""

    state: ReplicaState
    match: PrefixMatch = NO_MATCH

    @property
    def id(self) -> ReplicaId:
        return self.state.id


@dataclass(frozen=True, slots=True)
class Decision:
    """The output of routing: where to go, why, and what the policy predicted."""

    replica: ReplicaId
    reason: Reason
    predicted_cost: float = 0.0  # seconds of predicted TTFT for cost policies; policy-defined otherwise
    predicted_cached_tokens: float = 0.0  # what the policy expects the replica to report as cached
    breakdown: Mapping[str, float] = field(default_factory=dict)  # per-scorer terms, for /status and logs
    ranked: tuple[ReplicaId, ...] = ()  # the full preference order, for retries on another replica
