"""One replica's modelled KV cache: GPU, host and storage tiers as LRU sets of block hashes.

This mirrors SGLang's HiRadixCache (contract §3.1) at block granularity:

- a request's blocks enter the GPU tier; a GPU hit touches them, a host hit is *promoted* (loaded back
  to GPU, the host copy stays), a storage hit is prefetched through host into GPU;
- ``write_through``: every new block gets its host copy at insert; ``write_through_selective`` too, in
  effect: SGLang backs a node up on its second hit, and one served request already counts two (the insert
  after prefill, ``cache_unfinished_req``, and the one at finish); ``write_back``: only when the GPU
  evicts it;
- GPU eviction: a block with a host copy becomes host-only; under ``write_back`` one without is demoted
  to host; otherwise (HiCache off, or write-through without a copy) it is dropped;
- host eviction drops the host copy (least recently used first); the storage tier receives every block
  that gets a host copy (SGLang backs up to L3 when the host write is acknowledged) and evicts LRU.

Blocks of a request are touched **deepest first**, so the first block is the most recent: the LRU then
evicts the tails of old sequences before their shared roots, like a radix tree evicting leaves. A match
is contiguous from the first block: the GPU run, then the host run, then the storage run.

Data structure and trade-off. Each tier is a plain ``dict[int, None]`` used as an ordered set: insertion
order is recency (touch = pop + re-insert), membership is one C-level lookup, and a leading run is found
with ``map(dict.__contains__, chunk)`` in galloping chunks (~25 ns per block). A dict entry costs ~35-70
bytes plus the 32-byte int key, about 80 bytes per block in practice (10M blocks ≈ 0.8 GB, see
``bench/micro_routing.py``). An ``OrderedDict`` would make single evictions O(1) but doubles the memory;
an array-backed open-addressing table in ``array('Q')`` would halve it but costs a Python-level probe per
lookup (~10x slower matching). Evicting the oldest entries of a dict scans deleted slots at its front, so
eviction is **batched**: when a tier exceeds its capacity it evicts down to ``capacity - capacity // 64``,
which keeps that scan amortized to O(1) per block while holding the tier within 1.6% of its capacity.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import compress, filterfalse, islice, repeat

from routing.types import BlockHash, ReplicaState, WritePolicy

EVICT_BATCH_DIVISOR = 64
"""An over-full tier evicts ``excess + capacity // 64`` blocks at once (see the module docstring)."""

COMPACT_BYTES_PER_BLOCK = 64
"""A tier whose dict table exceeds this many bytes per live block is rebuilt compact (see above)."""


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


class BlockLru:
    """An LRU set of block hashes with a capacity in blocks."""

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int = 0) -> None:
        self._blocks: dict[BlockHash, None] = {}
        self.capacity = capacity

    def __contains__(self, block: BlockHash) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def table_bytes(self) -> int:
        """Bytes of the dict table itself (without the key objects)."""
        return sys.getsizeof(self._blocks)

    def order(self) -> list[BlockHash]:
        """Blocks from least to most recently used (for tests and debugging)."""
        return list(self._blocks)

    def touch(self, block: BlockHash) -> None:
        """Makes ``block`` the most recently used, inserting it if absent."""
        blocks = self._blocks
        blocks.pop(block, None)
        blocks[block] = None

    def touch_all(self, blocks: Sequence[BlockHash]) -> None:
        """Touches ``blocks`` in order (the last one ends most recent), in two C-level passes."""
        if blocks:
            stored = self._blocks
            list(map(stored.pop, blocks, repeat(None)))
            stored.update(dict.fromkeys(blocks))

    def discard_all(self, blocks: Sequence[BlockHash]) -> None:
        stored = self._blocks
        list(map(stored.pop, blocks, repeat(None)))

    def clear(self) -> None:
        self._blocks = {}

    def overflow(self) -> list[BlockHash]:
        """Evicts least recently used blocks when over capacity; returns them, oldest first."""
        excess = len(self._blocks) - self.capacity
        if excess <= 0:
            return []
        victims = list(islice(self._blocks, excess + self.capacity // EVICT_BATCH_DIVISOR))
        blocks = self._blocks
        list(map(blocks.__delitem__, victims))
        if sys.getsizeof(blocks) > COMPACT_BYTES_PER_BLOCK * len(blocks) + 4096:
            self._blocks = dict.fromkeys(blocks)  # same order, table sized for the live blocks
        return victims

    def run(self, hashes: Sequence[BlockHash], start: int) -> int:
        """How many of ``hashes[start:]`` are present, contiguously from ``start``."""
        n = len(hashes)
        contains = self._blocks.__contains__
        if start >= n or not contains(hashes[start]):
            return 0
        i, step = start + 1, 16
        while i < n:
            flags = list(map(contains, hashes[i : i + step]))
            if False in flags:
                return i + flags.index(False) - start
            i += len(flags)
            step *= 4
        return n - start


class ReplicaTiers:
    """GPU, host and storage tiers of one replica with its write policy (see the module docstring)."""

    __slots__ = ("gpu", "host", "policy", "storage")

    def __init__(self) -> None:
        self.gpu = BlockLru()
        self.host = BlockLru()
        self.storage = BlockLru()
        self.policy: WritePolicy | None = None

    def configure(self, gpu: int, host: int, storage: int, policy: WritePolicy | None) -> None:
        """Sets capacities in blocks (host 0 = no reusable host tier) and evicts down to them."""
        self.gpu.capacity, self.host.capacity, self.storage.capacity = gpu, host, storage
        self.policy = policy
        if host <= 0:
            self.host.clear()
        if storage <= 0:
            self.storage.clear()
        self.settle()

    def blocks(self) -> int:
        return len(self.gpu) + len(self.host) + len(self.storage)

    def runs(self, hashes: Sequence[BlockHash]) -> tuple[int, int, int]:
        """Leading blocks found on GPU, then only in host, then only in storage."""
        g = self.gpu.run(hashes, 0)
        h = self.host.run(hashes, g) if self.host.capacity > 0 else 0
        s = self.storage.run(hashes, g + h) if self.storage.capacity > 0 else 0
        return g, h, s

    def insert(self, hashes: Sequence[BlockHash]) -> tuple[int, int, int]:
        """Records that the replica served ``hashes``; returns the runs found before the insert.

        Equivalent to touching block by block from the deepest to the first (see the module docstring),
        done tier by tier in bulk: only the order within each tier matters.
        """
        g, h, s = self.runs(hashes)
        m = g + h + s
        host_on = self.host.capacity > 0
        new = hashes[m:][::-1] if self.policy in _COPY_AT_INSERT and host_on else ()
        from_storage = hashes[g + h : m][::-1]
        from_host = hashes[g : h + g][::-1]
        second_hit: Sequence[BlockHash] = ()
        if self.policy == "write_through_selective" and host_on:
            second_hit = list(filterfalse(self.host.__contains__, hashes[:g][::-1]))
        if host_on:
            self.host.touch_all((*new, *from_storage, *from_host, *second_hit))
        if self.storage.capacity > 0:
            self.storage.touch_all((*new, *from_storage, *second_hit) if host_on else from_storage)
        self.gpu.touch_all(hashes[::-1])
        self.settle()
        return g, h, s

    def settle(self) -> None:
        """Applies capacities: GPU overflow demotes or drops, then host and storage overflow drop."""
        victims = self.gpu.overflow()
        if victims and self.policy == "write_back" and self.host.capacity > 0:
            demoted = list(filterfalse(self.host.__contains__, victims))
            self.host.touch_all(demoted)
            if self.storage.capacity > 0:
                self.storage.touch_all(demoted)
        self.host.overflow()
        self.storage.overflow()

    def discard(self, blocks: Sequence[BlockHash]) -> None:
        """Removes ``blocks`` from every tier (a recorded request that never ran)."""
        for lru in (self.gpu, self.host, self.storage):
            lru.discard_all(blocks)

    def restart(self) -> None:
        """The replica restarted: GPU and host are gone, storage (L3) survives."""
        self.gpu.clear()
        self.host.clear()


class CountedBlocks:
    """A multiset of block hashes (blocks added by requests still in flight), updated in bulk."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[BlockHash, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, block: BlockHash) -> bool:
        return block in self._counts

    def first_of(self, blocks: Sequence[BlockHash]) -> int:
        """Index of the first of ``blocks`` in the multiset, ``len(blocks)`` when none is."""
        if not self._counts:
            return len(blocks)
        flags = list(map(self._counts.__contains__, blocks))
        return flags.index(True) if True in flags else len(blocks)

    def add(self, blocks: Sequence[BlockHash]) -> None:
        counts = self._counts
        again = [(b, counts[b] + 1) for b in filter(counts.__contains__, blocks)]
        counts.update(dict.fromkeys(blocks, 1))
        counts.update(again)

    def remove(self, blocks: Sequence[BlockHash]) -> None:
        counts = self._counts
        old = list(map(counts.pop, blocks, repeat(0)))
        counts.update((b, c - 1) for b, c in compress(zip(blocks, old, strict=True), map((1).__lt__, old)))
