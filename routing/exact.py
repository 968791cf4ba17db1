"""Exact mode of one replica: its tiers follow its own KV events (pure; sglang-contract.md §6).

A replica enters exact mode with its first event batch (``CacheModel.apply_kv_events``). From then on the
events are the truth for every key they name (``routing.kv_index``: *event-backed* keys), the learned
model (``routing.tiers``) only for the rest:

- **0.5.23** (map encoding, ``medium`` per event): ``BlockStored``/``BlockRemoved`` with GPU put keys on
  and off the GPU tier, CPU_PINNED on and off the host tier, DISK the storage tier, exactly. The GPU tier
  never evicts by capacity an event-backed key, nor one the events are still to speak for (``Kept``,
  ``ReplicaTiers.backed``): an in-flight request's, or a finished one's awaiting its stored event.
- **0.5.10** (array encoding, always "GPU"): stored = on GPU *or* host, removed = gone from both. The
  union is exact; the GPU/host split stays the model's LRU guess (a GPU victim that is event-backed is
  demoted to host, never dropped, ``ReplicaTiers.union``).
- ``AllBlocksCleared``: GPU and host are empty (storage survives), the index too.

Requests still record their blocks at routing time (``routing.ledger`` holds them provisionally), so a
request right behind sees them before the events arrive (they lag by up to a decode interval). A
stored event confirms a key in the ledger. A request that ran no longer makes its blocks real by
itself: its keys that events can speak for (``RoutingRequest.exact_keys``; on 0.5.10 only without a
namespace, whose salt the engine does not hash) wait for their stored event until a batch published
``GRACE_S`` after the first batch that follows the request's confirmation (routing has no clock: the
batches' timestamps are the time), and are then dropped if none came (and no in-flight request holds
them). Other requests (text
prompts keyed by characters, salted ones on 0.5.10, gateway tenants and LoRA namespaces: see
``ExactState.speaks_for``) stay learned: LRU by capacity, as without events.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from routing.block_lru import BlockLru
from routing.config import RoutingConfig
from routing.kv_events import AllBlocksCleared, BlockStored, EventBatch
from routing.kv_index import KvIndex
from routing.tiers import ReplicaTiers
from routing.types import BlockHash, ReplicaState, RoutingRequest

GRACE_S = 3.0
"""Seconds (publisher clock: batch timestamps) a confirmed request's keys wait for their BlockStored
event before they are dropped: SGLang publishes a finishing request's last pages on its decode-stats
path, every 40 decode steps (~0.4-1.2 s)."""


@dataclass(frozen=True, slots=True)
class KvMode:
    """One replica's cache-model mode for /status: ``exact`` (events are the truth) or ``learned``."""

    mode: str
    why: str = ""
    encoding: str = ""  # "array" (0.5.10) or "map" (0.5.23)
    batches: int = 0
    events: int = 0
    pages: int = 0  # engine pages remembered
    orphans: int = 0  # pages whose parent was unknown (stored before a reset)
    skipped: int = 0
    dropped: int = 0
    resets: int = 0
    last_reset: str = ""
    last_ts: float = 0.0  # publish time of the last batch applied


class Kept:
    """The keys exact mode never evicts by capacity: event-backed ones, and the ones events are still
    to speak for, held by in-flight requests (``routing.ledger``) or awaiting their stored event.

    The engine's GPU and host pools are full in steady state, so the event-backed keys alone fill the
    modelled tiers; an in-flight request's keys were then the only evictable ones and left the model as
    soon as they were recorded: the question right behind a document's first view was predicted a miss
    everywhere and sent to compute the document a second time. The engine makes room for them by
    evicting its own least recently used pages, which its events then report.
    """

    __slots__ = ("held", "state")

    def __init__(self, state: ExactState, held: Container[BlockHash]) -> None:
        self.state, self.held = state, held

    def __contains__(self, key: object) -> bool:
        s = self.state
        return key in s.index or key in self.held or key in s.awaiting or key in s.fresh


class ExactState:
    """The events' view of one replica (see the module docstring)."""

    def __init__(self, index: KvIndex, weight: float, held: Container[BlockHash] = frozenset()) -> None:
        self.index = index
        self.weight = weight  # engine tokens per key (token_block)
        self.kept = Kept(self, held)
        self.encoding = ""
        self.batches = 0
        self.events = 0
        self.resets = 0
        self.last_reset = ""
        self.last_ts = 0.0
        self.fresh: dict[BlockHash, None] = {}  # confirmed, no batch seen since
        self.awaiting: dict[BlockHash, float] = {}  # key -> ts of the first batch after its confirmation

    @classmethod
    def for_replica(
        cls, state: ReplicaState, cfg: RoutingConfig, model: str, held: Container[BlockHash]
    ) -> ExactState:
        """Pages remembered: the replica's GPU + host capacity in pages; ``held``: the keys its in-flight
        requests hold (kept whatever the capacity)."""
        pages = (state.gpu_tokens + state.host_tokens) // max(1, state.page_size)
        return cls(KvIndex(model, cfg.token_block, cfg.max_blocks, pages), float(cfg.token_block), held)

    def speaks_for(self, req: RoutingRequest) -> bool:
        """Whether the events can confirm ``req``'s keys: token keys in a namespace an event can name
        (``cache_salt + extra_key`` alone: a namespace with a gateway tenant or a LoRA part, joined by
        NUL in ``namespace_salt``, is not what an event's ``cache_salt`` keys), and on 0.5.10 (which does
        not hash the salt) no namespace at all."""
        if not req.exact_keys or "\x00" in req.tenant:
            return False
        return self.encoding != "array" or not req.tenant

    @property
    def exact(self) -> bool:
        return not self.index.why

    def attach(self, tiers: ReplicaTiers) -> None:
        """Points the tiers at the kept keys (or back to learned, when pages cannot map)."""
        tiers.backed = self.kept if self.exact else None
        tiers.union = self.encoding == "array"

    def apply(
        self, tiers: ReplicaTiers, batch: EventBatch, confirm: Callable[[list[BlockHash]], None]
    ) -> None:
        """One batch onto the tiers; ``confirm`` takes keys that are real now out of the ledger."""
        if batch.encoding != "empty":
            self.encoding = batch.encoding
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(tiers, ev, confirm)
            elif isinstance(ev, AllBlocksCleared):
                self.clear(tiers)
            else:
                self._removed(tiers, self.index.removed(ev.block_hashes, self._medium(ev.medium)), ev.medium)
        self.batches += 1
        self.events += len(batch.events)
        self.last_ts = batch.ts
        self.attach(tiers)
        tiers.settle()

    def expire(self, tiers: ReplicaTiers, held: Callable[[BlockHash], bool]) -> None:
        """After a batch: drops awaited keys whose grace is over and that no event stored, then starts
        the grace of the keys confirmed since the last batch (see the module docstring)."""
        limit, waiting = self.last_ts - GRACE_S, self.awaiting
        due = []
        for key, stamp in waiting.items():
            if stamp > limit:
                break
            due.append(key)
        for key in due:
            del waiting[key]
        tiers.discard([k for k in due if k not in self.index and not held(k)])
        waiting.update(dict.fromkeys(self.fresh, self.last_ts))
        self.fresh.clear()

    def wait_for(self, keys: Sequence[BlockHash]) -> None:
        """A request ran: its keys the events have not stored yet wait for them."""
        index, fresh = self.index, self.fresh
        for key in keys:
            if key not in index:
                self.awaiting.pop(key, None)
                fresh.pop(key, None)
                fresh[key] = None

    def clear(self, tiers: ReplicaTiers) -> None:
        tiers.restart()
        self.index.clear()
        self.awaiting.clear()
        self.fresh.clear()

    def reset(self, tiers: ReplicaTiers, reason: str) -> None:
        self.clear(tiers)
        self.resets += 1
        self.last_reset = reason

    def mode(self) -> KvMode:
        s = self.index.stats
        name, why = ("exact", "") if self.exact else ("learned", self.index.why)
        counts = (self.batches, self.events, len(self.index), s.orphans, s.skipped, s.dropped)
        return KvMode(name, why, self.encoding, *counts, self.resets, self.last_reset, self.last_ts)

    # ---- events ------------------------------------------------------------------------------------
    def _medium(self, medium: str | None) -> str | None:
        """The medium a removal names; None (every medium) in the 0.5.10 encoding."""
        return None if self.encoding == "array" else (medium or "GPU")

    def _stored(
        self, tiers: ReplicaTiers, ev: BlockStored, confirm: Callable[[list[BlockHash]], None]
    ) -> None:
        keys = self.index.stored(ev)
        if not keys:
            return
        confirm(keys)
        for key in keys:
            self.awaiting.pop(key, None)
            self.fresh.pop(key, None)
        lru = self._tier(tiers, ev.medium)
        if lru is not None:
            lru.touch_all(keys[::-1], self.weight)
        if lru is tiers.host and tiers.storage.capacity > 0:  # L3 backs up what lands on host
            tiers.storage.touch_all(keys[::-1], self.weight)

    def _removed(self, tiers: ReplicaTiers, keys: list[BlockHash], medium: str | None) -> None:
        if not keys:
            return
        if self.encoding == "array":
            tiers.gpu.discard_all(keys)
            tiers.host.discard_all(keys)
            return
        lru = self._tier(tiers, medium)
        if lru is not None:
            lru.discard_all(keys)

    def _tier(self, tiers: ReplicaTiers, medium: str | None) -> BlockLru | None:
        if self.encoding == "array" or medium in (None, "GPU"):
            return tiers.gpu
        if medium == "CPU_PINNED":
            return tiers.host if tiers.host.capacity > 0 else None
        if medium == "DISK":
            return tiers.storage if tiers.storage.capacity > 0 else None
        return None
