"""A read-only view of the ``Router``'s state, for ``/status`` and debugging (plain values).

Per replica: the blocks the cache model holds per tier, the engine tokens they weigh, the tiers'
capacities in tokens and the bytes of their tables, the effective-capacity factors and the accuracy of
its cached-token predictions (``routing.calibration``), and the learned rates (``routing.rates``).
Fleet-wide: the policy, the token estimate, the blocks held over all replicas and the tickets still open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from routing.block_lru import BlockLru
from routing.calibration import AccuracyStats
from routing.types import ReplicaId

if TYPE_CHECKING:
    from routing.cache_model import CacheModel
    from routing.rates import RateBook


@dataclass(frozen=True, slots=True)
class TierView:
    blocks: int
    tokens: float  # the engine tokens its blocks weigh
    capacity_tokens: float
    table_bytes: int = 0  # the tier's dict table (``BlockLru.table_bytes``), without the key objects


@dataclass(frozen=True, slots=True)
class RatesView:
    prefill_tokens_per_s: float
    host_tokens_per_s: float
    storage_tokens_per_s: float
    overhead_s: float
    decode_s_per_token: float
    samples: int


@dataclass(frozen=True, slots=True)
class ReplicaView:
    gpu: TierView
    host: TierView
    storage: TierView
    rates: RatesView
    accuracy: AccuracyStats | None


@dataclass(frozen=True, slots=True)
class RouterStatus:
    policy: str
    bytes_per_token: float
    block_tokens: float
    blocks: int
    open_tickets: int
    replicas: dict[ReplicaId, ReplicaView]


def _tier(lru: BlockLru) -> TierView:
    return TierView(len(lru), lru.tokens, lru.capacity, lru.table_bytes())


def router_status(
    name: str, cache: CacheModel, book: RateBook, bytes_per_token: float, open_tickets: int
) -> RouterStatus:
    """What the router's parts say of themselves (``Router.status`` passes them)."""
    bt = cache.block_tokens
    accuracy = cache.accuracy()
    replicas: dict[ReplicaId, ReplicaView] = {}
    for rid in cache.replica_ids():
        t = cache.tiers(rid)
        if t is None:
            continue
        gpu, host, storage = (_tier(x) for x in (t.gpu, t.host, t.storage))
        r = book.get(rid)
        rates = RatesView(
            r.prefill_tokens_per_s,
            r.host_tokens_per_s,
            r.storage_tokens_per_s,
            r.overhead_s,
            r.decode_s_per_token,
            r.samples,
        )
        replicas[rid] = ReplicaView(gpu, host, storage, rates, accuracy.get(rid))
    return RouterStatus(name, bytes_per_token, bt, cache.blocks(), open_tickets, replicas)
