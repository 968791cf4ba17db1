"""One replica's modelled KV cache: GPU, host and storage tiers as LRU sets of block hashes.

Each tier is a ``routing.block_lru.BlockLru`` (its data structure and batched eviction are described there).

This mirrors SGLang's HiRadixCache (contract §3.1) at block granularity:

- a request's blocks enter the GPU tier; a GPU hit touches them, a host hit is *promoted* (loaded back
  to GPU, the host copy stays), a storage hit is prefetched through host into GPU;
- ``write_through``: every block of a served request has its host copy after the insert (new blocks are
  backed up at once, matched ones that lack a copy too: SGLang's ``_inc_hit_count`` backs a node up at its
  first hit); ``write_through_selective`` the same in effect: SGLang backs a node up on its second hit, and
  one served request already counts two (the insert after prefill, ``cache_unfinished_req``, and the one at
  finish); ``write_back``: a block gets a copy only when the GPU evicts it;
- GPU eviction: a block with a host copy becomes host-only; under ``write_back`` one without is demoted
  to host; otherwise (HiCache off, or write-through without a copy) it is dropped;
- host eviction drops the least recently used host-only blocks. The host copy of a block that is still on
  GPU is not evictable, as in SGLang, whose ``evict_host`` takes only host nodes whose GPU copy is gone
  (when the host holds nothing but such copies it may stay over its capacity until some leave the GPU);
- the storage tier receives every block that gets a host copy (SGLang backs up to L3 when the host write
  is acknowledged) and evicts LRU.

**Recency rules, and the invariant they keep.** Every touch of a request's blocks in a tier goes
deepest first, so an ancestor is always touched after its descendants: the first block is the most recent.
A GPU eviction touches, in host, every block it moves to or leaves in host, oldest victim first, so a
host-only block is never older than the time it left the GPU, and the GPU evicts descendants first; host
eviction skips the (pinned) copies of blocks still on GPU. Because blocks are chained (a block's hash
names its whole prefix), this keeps two sets *prefix-closed* along every chain: the GPU tier, and
GPU ∪ host (a block present implies its ancestors present): neither ever loses an ancestor before its
descendants. Closure makes "is block i in the tier" monotone along a request's
chain, so the GPU run and the host run that follows it are found by **bisection**, O(log n) lookups per
replica instead of a walk over every matched block (a 128K-token prompt is 2048 blocks: ~12 lookups
instead of 2048). The storage tier keeps no such order (an L3 backend can lose a page in the middle of a
prefix), so its run is walked.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from itertools import filterfalse

from routing.block_lru import BlockLru, bisect_run
from routing.types import BlockHash, ReplicaState, WritePolicy


def host_reusable(state: ReplicaState) -> bool:
    """Whether blocks in the replica's host tier can be loaded back: HiCache on, and not a hybrid
    (GDN/Mamba) model under a write-through policy, whose host copies lack the recurrent-state anchor
    a match needs (contract §3.2; the seeds measured re-sends as slow as cold prefills)."""
    if state.write_policy is None or state.host_tokens <= 0:
        return False
    return not (state.hybrid and state.write_policy != "write_back")


def tier_warnings(state: ReplicaState) -> tuple[str, ...]:
    """Operator warnings about a replica's cache tiers (for start-up logs and /status)."""
    if state.write_policy is None or state.host_tokens <= 0:
        return (
            "HiCache is off: blocks evicted from GPU are lost; --enable-hierarchical-cache "
            "--hicache-write-policy write_back keeps them reusable in host memory",
        )
    if not host_reusable(state):
        return (
            f"hybrid model with --hicache-write-policy {state.write_policy}: the host pool fills "
            "but is not reused (the routing model ignores it); use --hicache-write-policy write_back",
        )
    return ()


_COPY_AT_INSERT = ("write_through", "write_through_selective")  # see the module docstring
EXACT_GPU_SCAN = 64
"""Entries an exact GPU tier's overflow looks at per settle. Its kept keys (``routing.exact.Kept``) may hold
it over capacity for as long as requests are in flight, so an uncapped scan would walk thousands of
pinned entries at every event batch and every routed request (measured: 16 -> 565 us per batch on a
750-block tier with three 8K-token requests in flight); 64 at a time, rotated to the recent end, still
reaches every learned key in turn."""


class ReplicaTiers:
    """GPU, host and storage tiers of one replica with its write policy (see the module docstring)."""

    __slots__ = ("backed", "gpu", "host", "policy", "storage", "union")

    def __init__(self) -> None:
        self.gpu = BlockLru()
        self.host = BlockLru()
        self.storage = BlockLru()
        self.policy: WritePolicy | None = None
        # exact mode (routing.exact): the keys the replica's KV events say it holds, never evicted by
        # capacity; ``union``: they hold for GPU or host together (0.5.10), the split being guessed
        self.backed: Container[BlockHash] | None = None
        self.union = False

    def configure(self, gpu: float, host: float, storage: float, policy: WritePolicy | None) -> None:
        """Sets capacities in engine tokens (host 0 = no reusable host tier) and evicts down to them."""
        self.gpu.capacity, self.host.capacity, self.storage.capacity = gpu, host, storage
        self.policy = policy
        if host <= 0:
            self.host.clear()
        if storage <= 0:
            self.storage.clear()
        self.settle()

    def blocks(self) -> int:
        return len(self.gpu) + len(self.host) + len(self.storage)

    def runs(self, hashes: Sequence[BlockHash], reverse: Sequence[BlockHash] = ()) -> tuple[int, int, int]:
        """Leading blocks found on GPU, then only in host, then only in storage (``reverse``: the hashes
        reversed, when the caller already has them). A request whose first block is in no tier matches
        nothing, which is settled with three lookups (most replicas for most requests)."""
        first = hashes[0] if hashes else None
        gpu, host, storage = self.gpu, self.host, self.storage
        if first is None or not (first in gpu._blocks or first in host._blocks or first in storage._blocks):
            return 0, 0, 0
        if self.union and self.backed is not None:
            return self._union_runs(hashes)
        reverse = reverse or hashes[::-1]
        g = gpu.run(reverse, 0)
        h = host.run(reverse, g) if host.capacity > 0 else 0
        s = storage.walk(hashes, g + h) if storage.capacity > 0 else 0
        return g, h, s

    def _union_runs(self, hashes: Sequence[BlockHash]) -> tuple[int, int, int]:
        """Exact mode with 0.5.10 events: GPU ∪ host is what the events say, prefix-closed as the
        engine's tree, so its run is bisected; event touches do not keep the guessed GPU/host split
        closed, so the GPU's share of it is the bisection's estimate (the split is a guess anyway)."""
        gpu, host = self.gpu._blocks, self.host._blocks
        reverse = hashes[::-1]
        n = bisect_run(lambda b: b in gpu or b in host, reverse, 0)
        g = min(n, self.gpu.run(reverse, 0))
        s = self.storage.walk(hashes, n) if self.storage.capacity > 0 else 0
        return g, n - g, s

    def insert(
        self, hashes: Sequence[BlockHash], weight: float = 1.0, found: tuple[int, int, int] | None = None
    ) -> tuple[int, int, int]:
        """Records that the replica served ``hashes`` (blocks of ``weight`` engine tokens each); returns
        the runs found before the insert (``found``: they were just computed by ``runs``).

        Equivalent to touching block by block from the deepest to the first (see the module docstring),
        done tier by tier in bulk: only the order within each tier matters.
        """
        g, h, s = self.runs(hashes) if found is None else found
        m = g + h + s
        host, storage = self.host, self.storage
        if self.backed is not None and not self.union:  # exact tiers: only the GPU gets it, for now
            self.gpu.touch_all(hashes[::-1], weight)
            self.settle()
            return g, h, s
        if host.capacity > 0:
            hosted = self._hosted(hashes, g, m)
            if storage.capacity > 0:
                storage.touch_all(list(filterfalse(host.__contains__, hosted))[::-1], weight)
            host.touch_all(hosted[::-1], weight)
        elif storage.capacity > 0:
            storage.touch_all(hashes[g + h : m][::-1], weight)
        self.gpu.touch_all(hashes[::-1], weight)
        self.settle()
        return g, h, s

    def _hosted(self, hashes: Sequence[BlockHash], g: int, m: int) -> Sequence[BlockHash]:
        """The request's blocks touched in host: all of them under the write-through policies (each has
        its copy after the insert); under write_back what it loaded through host (the copies of blocks
        still on GPU are pinned and get their place when they leave the GPU)."""
        return hashes if self.policy in _COPY_AT_INSERT else hashes[g:m]

    def settle(self) -> None:
        """Applies capacities: GPU overflow demotes or drops, then host and storage overflow drop. In
        exact mode event-backed keys are never dropped: pinned on GPU, or with ``union`` demoted to host
        (pinned on GPU when there is no host tier)."""
        backed, host = self.backed, self.host
        exact_gpu = backed is not None and (not self.union or host.capacity <= 0)
        victims = self.gpu.overflow(backed, EXACT_GPU_SCAN) if exact_gpu else self.gpu.overflow()
        if victims and self.policy is not None and host.capacity > 0:
            kept = victims
            if self.policy != "write_back":
                kept = {b: w for b, w in victims.items() if b in host or (backed is not None and b in backed)}
            if self.storage.capacity > 0:
                self.storage.touch_items({b: w for b, w in kept.items() if b not in host})
            host.touch_items(kept)
        host.overflow(pinned=self.gpu if backed is None else _Either(self.gpu, backed))
        self.storage.overflow()

    def discard(self, blocks: Sequence[BlockHash]) -> None:
        """Removes ``blocks`` from every tier (a recorded request that never ran)."""
        for lru in (self.gpu, self.host, self.storage):
            lru.discard_all(blocks)

    def restart(self) -> None:
        """The replica restarted: GPU and host are gone, storage (L3) survives."""
        self.gpu.clear()
        self.host.clear()


class _Either:
    """Membership in either of two containers (the host tier's pinned keys in exact mode)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[BlockHash], b: Container[BlockHash]) -> None:
        self.a, self.b = a, b

    def __contains__(self, key: object) -> bool:
        return key in self.a or key in self.b
