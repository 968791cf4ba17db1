"""An LRU set of block hashes with a capacity in engine tokens: one tier of a replica's modelled cache.

Data structure and trade-off. Each tier is a plain ``dict[int, None]`` used as an ordered set: insertion
order is recency (touch = pop + re-insert), membership is one C-level lookup. A dict entry costs ~35-70
bytes plus the 32-byte int key, about 80-100 bytes per block in practice (10M blocks ≈ 0.95 GB, see
``bench/micro/routing.py``); a fleet-wide block → holders index would find every replica's run in one walk
but costs another dict entry per block (measured +37 B/block, over the 1 GB budget), which bisection makes
unnecessary. An ``OrderedDict`` would make single evictions O(1) but doubles the memory. Evicting the
oldest entries of a dict scans deleted slots at its front, so eviction is **batched**: when a tier exceeds
its capacity it evicts down to ``capacity - capacity // 64``, which keeps that scan amortized to O(1) per
block while holding the tier within 1.6% of its capacity.

A request's run in a tier is found by **bisection** (``BlockLru.run``) where presence is monotone along a
chain (the closure invariant that ``routing.tiers`` keeps), and by a galloping walk (``BlockLru.walk``)
where it is not.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Callable, Container, Mapping, Sequence
from itertools import repeat

from routing.types import BlockHash

EVICT_BATCH_DIVISOR = 64
"""An over-full tier evicts ``excess + capacity // 64`` blocks at once (see the module docstring)."""

COMPACT_BYTES_PER_BLOCK = 64
"""A tier whose dict table exceeds this many bytes per live block is rebuilt compact (see above)."""

_SCAN_FACTOR = 4  # host eviction looks at most this many entries per victim wanted (skipping GPU copies)


class BlockLru:
    """An LRU set of block hashes, each weighing its engine tokens, with a capacity in engine tokens.

    A block's weight is the tokens per block of the request that touched it last (text and token-id
    prompts pack different numbers of tokens into a block of canonical bytes), so a tier holds as many
    tokens as the replica's pool, whatever mix of prompts filled it. The weights of one request are one
    shared float object: the dict's values cost nothing beyond the pointer a set-like dict pays anyway."""

    __slots__ = ("_blocks", "capacity", "tokens")

    def __init__(self, capacity: float = 0.0) -> None:
        self._blocks: dict[BlockHash, float] = {}
        self.capacity = capacity
        self.tokens = 0.0

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def table_bytes(self) -> int:
        """Bytes of the dict table itself (without the key objects)."""
        return sys.getsizeof(self._blocks)

    def order(self) -> list[BlockHash]:
        """Blocks from least to most recently used (for tests and debugging)."""
        return list(self._blocks)

    def touch_all(self, blocks: Sequence[BlockHash], weight: float = 1.0) -> None:
        """Touches ``blocks`` in order (the last one ends most recent), each weighing ``weight``."""
        if blocks:
            self.touch_items(dict.fromkeys(blocks, weight))

    def touch_items(self, items: Mapping[BlockHash, float]) -> None:
        """Touches the blocks of ``items`` in their order, with their weights, in C-level passes."""
        if items:
            stored = self._blocks
            old = sum(map(stored.pop, items, repeat(0.0)))
            stored.update(items)
            self.tokens += sum(items.values()) - old

    def discard_all(self, blocks: Sequence[BlockHash]) -> None:
        self.tokens -= sum(map(self._blocks.pop, blocks, repeat(0.0)))

    def clear(self) -> None:
        self._blocks, self.tokens = {}, 0.0

    def overflow(
        self, pinned: Container[BlockHash] | None = None, scan: int | None = None
    ) -> dict[BlockHash, float]:
        """Evicts least recently used blocks when over capacity, the excess and a batch of a 64th of the
        capacity's blocks (at the mean weight) at once; returns them with their weights, oldest first.

        Blocks in ``pinned`` are not evictable (host copies of blocks still on GPU): they are skipped and
        moved to the most recent end, so a later eviction does not scan them again; at most
        ``_SCAN_FACTOR`` entries per expected victim are looked at, which bounds the work when most of
        the tier is pinned (it then stays over capacity until pinned blocks leave the GPU); ``scan``
        caps that count, for a tier that may stay over capacity for long (exact mode's GPU)."""
        excess = self.tokens - self.capacity
        if excess <= 1e-9 or not self._blocks:
            return {}
        blocks = self._blocks
        mean = self.tokens / len(blocks)  # the batch is capacity // 64 in blocks of the mean weight
        want = excess + (self.capacity / mean) // EVICT_BATCH_DIVISOR * mean
        limit = int(_SCAN_FACTOR * want / mean) + 64
        if scan is not None:
            limit = min(limit, scan)
        victims: dict[BlockHash, float] = {}
        moved: list[BlockHash] = []
        freed = 0.0
        for scanned, (block, weight) in enumerate(blocks.items()):
            if pinned is not None:
                if scanned >= limit:
                    break
                if block in pinned:
                    moved.append(block)
                    continue
            victims[block] = weight
            freed += weight
            if freed >= want - 1e-9:
                break
        list(map(blocks.__delitem__, victims))
        self.tokens -= freed
        if moved:
            self.touch_items({b: blocks[b] for b in moved})
        if sys.getsizeof(blocks) > COMPACT_BYTES_PER_BLOCK * len(blocks) + 4096:
            self._blocks = dict(blocks)  # same order, table sized for the live blocks
        return victims

    def run(self, reverse: Sequence[BlockHash], start: int) -> int:
        """How many blocks of the request are present, contiguously from block ``start``; ``reverse`` is
        the request's hashes in reverse order. Bisection (C-level ``bisect`` with the dict's own
        ``__contains__`` as key, ~log2(n) lookups): valid because presence is monotone along a chain,
        the closure invariant of ``routing.tiers``. In reverse order presence reads absent...absent,
        present...present, an ascending sequence, so the first present one marks where the run ends."""
        return bisect_run(self._blocks.__contains__, reverse, start)

    def walk(self, hashes: Sequence[BlockHash], start: int) -> int:
        """The same run without assuming monotone presence: galloping C-level membership scans."""
        return _walk(self._blocks.__contains__, hashes, start)


def bisect_run(contains: Callable[[BlockHash], bool], reverse: Sequence[BlockHash], start: int) -> int:
    """``BlockLru.run`` over any membership test that is monotone along the chain."""
    end = len(reverse) - start  # reverse[:end] are blocks start..n-1, deepest first
    if end <= 0 or not contains(reverse[end - 1]):  # block ``start`` itself is absent
        return 0
    if contains(reverse[0]):  # the deepest block is present: the whole rest is
        return end
    return end - bisect_left(reverse, True, 0, end - 1, key=contains)


def _walk(contains: Callable[[BlockHash], bool], hashes: Sequence[BlockHash], start: int) -> int:
    """How many of ``hashes`` from ``start`` on are present, contiguously: galloping C-level scans."""
    n = len(hashes)
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
