"""A naive reference of one replica's tiered cache: Python lists, linear scans, no tricks.

Semantics (the same rules as ``routing.tiers`` and ``routing.ledger``, written the slow obvious way):
every tier is a list ordered from least to most recently used; a request touches its blocks deepest
first; a block the GPU evicts into (or leaves in) host is touched there; a tier over capacity evicts
``excess + capacity // 64`` of its oldest blocks at once, the host tier only blocks that are not on
GPU (it looks at no more than ``4 x wanted + 64`` of its oldest entries, and moves the GPU-resident
ones it passed to the recent end).
Runs are found by walking, so a model that bisects must agree with this one block for block.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import WritePolicy


class RefLru:
    def __init__(self, capacity: int = 0) -> None:
        self.items: list[int] = []
        self.capacity = capacity

    def touch(self, block: int) -> None:
        if block in self.items:
            self.items.remove(block)
        self.items.append(block)

    def overflow(self, pinned: RefLru | None = None) -> list[int]:
        excess = len(self.items) - self.capacity
        if excess <= 0:
            return []
        n = excess + self.capacity // 64
        if pinned is None:
            victims, self.items = self.items[:n], self.items[n:]
            return victims
        window = self.items[: 4 * n + 64]
        victims = [b for b in window if b not in pinned.items][:n]
        last = window.index(victims[-1]) + 1 if victims else len(window)
        moved = [b for b in window[:last] if b in pinned.items]
        self.items = [b for b in self.items if b not in victims and b not in moved] + moved
        return victims

    def discard(self, block: int) -> None:
        if block in self.items:
            self.items.remove(block)

    def run(self, hashes: Sequence[int], start: int) -> int:
        n = 0
        while start + n < len(hashes) and hashes[start + n] in self.items:
            n += 1
        return n


class RefTiers:
    def __init__(self) -> None:
        self.gpu, self.host, self.storage = RefLru(), RefLru(), RefLru()
        self.policy: WritePolicy | None = None

    def configure(self, gpu: int, host: int, storage: int, policy: WritePolicy | None) -> None:
        self.gpu.capacity, self.host.capacity, self.storage.capacity = gpu, host, storage
        self.policy = policy
        if host <= 0:
            self.host.items = []
        if storage <= 0:
            self.storage.items = []
        self.settle()

    def runs(self, hashes: Sequence[int]) -> tuple[int, int, int]:
        g = self.gpu.run(hashes, 0)
        h = self.host.run(hashes, g) if self.host.capacity > 0 else 0
        s = self.storage.run(hashes, g + h) if self.storage.capacity > 0 else 0
        return g, h, s

    def backup(self, block: int) -> None:
        """The block's host copy is made now (also in storage) or, if it had one, touched."""
        if block not in self.host.items and self.storage.capacity > 0:
            self.storage.touch(block)
        self.host.touch(block)

    def insert(self, hashes: Sequence[int]) -> tuple[int, int, int]:
        g, h, s = self.runs(hashes)
        host_on = self.host.capacity > 0
        copy_all = self.policy in ("write_through", "write_through_selective") and host_on
        for i in reversed(range(len(hashes))):
            block = hashes[i]
            if i < g:  # GPU hit: the write-through policies back it up (or touch its copy)
                if copy_all:
                    self.backup(block)
            elif i < g + h:  # host hit: loaded back, the host copy stays
                self.host.touch(block)
            elif i < g + h + s:  # storage hit: prefetched through host
                if host_on:
                    self.backup(block)
                else:
                    self.storage.touch(block)
            elif copy_all:  # new block, copied to host at once (selective: a served request counts two)
                self.backup(block)
            self.gpu.touch(block)
        self.settle()
        return g, h, s

    def settle(self) -> None:
        victims = self.gpu.overflow()
        if self.policy is not None and self.host.capacity > 0:
            for block in victims:  # oldest first: demoted (write_back) or kept where it has a copy
                if self.policy == "write_back" or block in self.host.items:
                    self.backup(block)
        self.host.overflow(pinned=self.gpu)
        self.storage.overflow()

    def discard(self, blocks: Sequence[int]) -> None:
        for lru in (self.gpu, self.host, self.storage):
            for block in blocks:
                lru.discard(block)

    def restart(self) -> None:
        self.gpu.items, self.host.items = [], []


class RefEnds:
    """Where recorded prompts ended (hybrid replicas): (last block, shortest length in blocks), least
    recently recorded first; over capacity it drops ``excess + capacity // 64`` of the oldest at once."""

    def __init__(self) -> None:
        self.items: list[tuple[int, float]] = []
        self.capacity = 0

    def length(self, end: int) -> float | None:
        for block, length in self.items:
            if block == end:
                return length
        return None

    def add(self, hashes: Sequence[int], prompt_tokens: float, block_tokens: float) -> bool:
        length = prompt_tokens / block_tokens
        if not hashes or length > len(hashes) + 1.5:  # a prompt cut at max_blocks has no hashed end
            return False
        end = hashes[-1]
        known = self.length(end)
        self.items = [(b, n) for b, n in self.items if b != end]
        self.items.append((end, length if known is None else min(known, length)))
        if len(self.items) > self.capacity:
            self.items = self.items[len(self.items) - self.capacity + self.capacity // 64 :]
        return known is None

    def discard(self, end: int) -> None:
        self.items = [(b, n) for b, n in self.items if b != end]


class RefProvisional:
    """Blocks in-flight requests hold, per replica: block -> count (routing.ledger, the obvious way)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[int, int]] = {}

    def first_held(self, rid: str, blocks: Sequence[int]) -> int:
        held = self.counts.get(rid, {})
        return next((i for i, b in enumerate(blocks) if b in held), len(blocks))

    def hold(self, rid: str, blocks: Sequence[int]) -> None:
        held = self.counts.setdefault(rid, {})
        for b in blocks:
            held[b] = held.get(b, 0) + 1

    def confirm(self, rid: str, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.counts.get(rid, {}).pop(b, None)

    def release(self, rid: str, blocks: Sequence[int]) -> list[int]:
        held, gone = self.counts.get(rid, {}), []
        for b in blocks:
            if b in held:
                held[b] -= 1
                if held[b] == 0:
                    del held[b]
                    gone.append(b)
        return gone
