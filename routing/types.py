"""Value types shared by every routing module and by the proxy that feeds them.

Everything here is immutable: frozen dataclasses with slots, or, for the few values built once per
candidate replica on every request (``PrefixMatch``, ``Candidate``, ``TtftTerms``), NamedTuples, which
are built ~2.5x faster (0.36 against 0.89 µs for five fields, measured): at 256 replicas that is the
difference between a fraction of a millisecond and most of one. The routing library is pure, so its
inputs are snapshots and its outputs are values. Token counts are estimated engine tokens
(``routing.tokens``) unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

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
    WARMUP = "warmup"  # a warm-up step, placed by routing.warm_placement


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What the policies and the cache model see of one request (never its text): built by the
    ``Router`` from a ``routing.prompt.PromptRequest``."""

    model: str
    block_hashes: tuple[BlockHash, ...]
    prompt_tokens: int  # estimated engine tokens of the prompt (exact for token-id prompts)
    block_tokens: float  # estimated engine tokens per full block
    session_key: str | None = None  # the conversation key (x-session-id), None when there is none
    tenant: str = ""  # the cache namespace (routing.canonical.namespace_salt), already in block_hashes
    max_new_tokens: int | None = None  # the output budget the engine applies, None when unbounded/unknown
    exact_keys: bool = False  # block_hashes are token_block_hashes of engine token ids (KV events name them)


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A snapshot of one replica as the fleet manager sees it at routing time."""

    id: ReplicaId
    healthy: bool = True
    draining: bool = False
    inflight_requests: int = 0
    inflight_prefill_tokens: int = 0  # predicted uncached prompt tokens routed there, no first token yet
    inflight_prefill_s: float = 0.0  # predicted prefill work queued there, seconds (proxy/fleet/load.py)
    # (s decoded, output budget, KV tokens held) per decoding request, only filled when the running slots
    # are full (max_running_requests) or the KV held fills half the pool: when a slot or memory frees
    decoding: tuple[tuple[float, int, int], ...] = ()
    kv_tokens: int = 0  # KV held by the requests in flight there: predicted uncached prompt + output budget
    arrival_rate: float = 0.0  # requests routed there per second, recently
    utilization: float = 0.0  # predicted prefill seconds routed there per second, recently
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
    chunk_tokens: int = 0  # chunked_prefill_size: tokens per prefill chunk; -1 = chunking off, 0 = unknown
    started_at: float = 0.0  # replica start time as reported; a change means a restart


class PrefixMatch(NamedTuple):
    """Leading tokens of the request found on one replica, per tier (disjoint, GPU first)."""

    gpu_tokens: float = 0.0
    host_tokens: float = 0.0
    storage_tokens: float = 0.0

    @property
    def total_tokens(self) -> float:
        return self.gpu_tokens + self.host_tokens + self.storage_tokens


NO_MATCH = PrefixMatch()


class Candidate(NamedTuple):
    """A replica that passed the filters so far, with what the cache model says it holds."""

    state: ReplicaState
    match: PrefixMatch = NO_MATCH

    @property
    def id(self) -> ReplicaId:
        return self.state.id


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a policy sent a request and why, and its preference order for retries."""

    replica: ReplicaId
    reason: Reason
    cost: float = 0.0  # the policy's score of the chosen replica (seconds for the cost policy)
    ranked: tuple[ReplicaId, ...] = ()  # the full preference order, chosen first


class TtftTerms(NamedTuple):
    """Predicted time to first token of one request on one replica, term by term (routing.ttft)."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    reload_s: float = 0.0
    overhead_s: float = 0.0
    uncached_tokens: float = 0.0

    @property
    def total(self) -> float:
        return self.queue_s + self.prefill_s + self.reload_s + self.overhead_s


NO_TERMS = TtftTerms()


@dataclass(frozen=True, slots=True)
class Prediction:
    """What routing expects of the replica that will serve the request: the cache model's match there
    and the TTFT terms. Re-made for the new replica when a request is retried elsewhere."""

    replica: ReplicaId
    match: PrefixMatch = NO_MATCH
    terms: TtftTerms = NO_TERMS

    @property
    def cached_tokens(self) -> float:
        return self.match.total_tokens

    @property
    def uncached_tokens(self) -> float:
        return self.terms.uncached_tokens


@dataclass(frozen=True, slots=True)
class Report:
    """What the replica reported once a routed request finished (or failed)."""

    ok: bool
    prompt_tokens: int | None = None  # usage.prompt_tokens as the replica reported it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, None when not reported
    ttft_s: float | None = None  # time to the first byte of the response body; None: none arrived
    completion_tokens: int | None = None  # usage.completion_tokens
    decode_s: float | None = None  # first byte to the end of a streamed answer

    @property
    def ran(self) -> bool:
        """False when the request failed before any byte came back: it never reached the engine."""
        return self.ok or self.ttft_s is not None
