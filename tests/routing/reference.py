"""A naive reference of one replica's tiered cache: Python lists, linear scans, no tricks.

Semantics (the same rules as ``routing.tiers``, written the slow obvious way): every tier is a list
ordered from least to most recently used; a request touches its blocks deepest first; a tier over
capacity evicts ``excess + capacity // 64`` of its oldest blocks at once.
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

    def overflow(self) -> list[int]:
        excess = len(self.items) - self.capacity
        if excess <= 0:
            return []
        n = excess + self.capacity // 64
        victims, self.items = self.items[:n], self.items[n:]
        return victims

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
        self.host.touch(block)
        if self.storage.capacity > 0:
            self.storage.touch(block)

    def insert(self, hashes: Sequence[int]) -> tuple[int, int, int]:
        g, h, s = self.runs(hashes)
        host_on = self.host.capacity > 0
        for i in reversed(range(len(hashes))):
            block = hashes[i]
            if i < g:  # GPU hit: the second hit backs up under write_through_selective
                if self.policy == "write_through_selective" and host_on and block not in self.host.items:
                    self.backup(block)
            elif i < g + h:  # host hit: loaded back, the host copy stays
                self.host.touch(block)
            elif i < g + h + s:  # storage hit: prefetched through host
                self.storage.touch(block)
                if host_on:
                    self.backup(block)
            elif self.policy in ("write_through", "write_through_selective") and host_on:
                # new block, copied to host at once (selective: a served request counts two hits)
                self.backup(block)
            self.gpu.touch(block)
        self.settle()
        return g, h, s

    def settle(self) -> None:
        for block in self.gpu.overflow():
            if self.policy == "write_back" and self.host.capacity > 0 and block not in self.host.items:
                self.backup(block)
        self.host.overflow()
        self.storage.overflow()

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

    def add(self, hashes: Sequence[int], prompt_tokens: float, block_tokens: float) -> None:
        length = prompt_tokens / block_tokens
        if not hashes or length > len(hashes) + 1.5:  # a prompt cut at max_blocks has no hashed end
            return
        end = hashes[-1]
        known = self.length(end)
        self.items = [(b, n) for b, n in self.items if b != end]
        self.items.append((end, length if known is None else min(known, length)))
        if len(self.items) > self.capacity:
            self.items = self.items[len(self.items) - self.capacity + self.capacity // 64 :]
