"""Recurrent-state anchors of hybrid GDN/Mamba + attention models (SGLang 0.5.10 HiMambaRadixCache).

A hybrid model can resume from a cached prefix only where it also has the recurrent (mamba) state of
that exact position, so a prefix is usable only up to the deepest node holding an *anchor* on GPU or on
host (``cut``). Anchors are scarce, and that is the whole story of the seeds' write_through finding:

- Device slots (``mamba_slots``, ``--max-mamba-cache-size``) hold the anchors of cached nodes plus one
  per running request (which also pins the anchor it resumes from; the path above stays tombstone-able,
  as SGLang locks the mamba state of the last matched node only). When full, the least recently used
  unpinned anchor goes (``_evict_one``): an internal or locked node is *tombstoned* (KV kept, anchor
  dropped, no host copy); an unlocked GPU leaf is evicted as a whole through the cache's leaf eviction
  (so under write_back it is written to host with its live anchor).
- Host slots (``host_mamba_slots``) are taken by ``backup`` when a node that has a device anchor is
  copied to host. When full, the LRU host anchor goes (``_evict_host_one``): a host-only leaf is deleted
  (KV too); any other node just loses its host anchor, even if it is still on GPU.
- A node that is already backed up is demoted on GPU eviction without copying its anchor again.
- A running request's tree inserts (``cache_unfinished_req``, after each prefill chunk) follow the same
  rules as the insert at finish: the new nodes get anchors where an insert at that length would put them,
  and the request's pin moves to the deepest inserted node (``move_pin``).

With ``mamba_extra_buffer`` an insert creates one node, hence one anchor, per ``mamba_track_interval``
tokens, so write_through's backup-at-insert burns through the host slots and reclaims the anchors of
nodes that are still on GPU; once those nodes are evicted their host KV can never be matched. (Only
tracked states exist then, so a finished request is inserted up to its last track point, like SGLang's
``mamba_last_track_seqlen``; a re-sent prompt can resume from there.) Under
write_back the backup happens at eviction, together with the live anchor, and re-sends hit the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from emulator.cache_values import CacheConfig
from emulator.radix_node import LruIndex, Node


class Anchors:
    """Device and host anchor pools with LRU eviction; every method is a no-op for non-hybrid models."""

    def __init__(
        self, cfg: CacheConfig, evict_leaf: Callable[[Node], None], delete: Callable[[Node], None]
    ) -> None:
        self.on = cfg.hybrid
        self.slots = cfg.mamba_slots
        self.host_slots = cfg.host_mamba_slots if cfg.hicache else 0
        self.interval = cfg.mamba_track_interval if cfg.mamba_extra_buffer else 0
        self.cached = 0  # device anchors of cached nodes
        self.running = 0  # device slots of running requests
        self.host_used = 0
        self._evict_leaf = evict_leaf
        self._delete = delete
        self._gpu_lru = LruIndex()
        self._host_lru = LruIndex()

    @property
    def used(self) -> int:
        return self.cached + self.running

    def refresh(self, node: Node) -> None:
        if self.on:
            free = node.mamba_lock == 0
            self._gpu_lru.set(node, free and node.mamba_gpu)
            self._host_lru.set(node, free and node.mamba_host)

    def cut(self, path: Sequence[Node]) -> list[Node]:
        """The matched path up to (and including) its deepest anchored node."""
        for i in range(len(path) - 1, -1, -1):
            if path[i].mamba_gpu or path[i].mamba_host:
                return list(path[: i + 1])
        return []

    def can_run(self, path: Sequence[Node]) -> bool:
        """Whether a request using ``path`` can get a device slot (after evicting unlocked anchors)."""
        if not self.on or self.used < self.slots:
            return True
        pinned = int(bool(path) and path[-1].mamba_gpu and path[-1].mamba_lock == 0)
        return len(self._gpu_lru) - pinned > 0

    def start_request(self, node: Node) -> None:
        """Pin the anchor the request resumes from (``node``) and take a running slot."""
        if self.on:
            node.mamba_lock += 1
            self.refresh(node)
            if self.used >= self.slots:
                self._evict_one()
            self.running += 1

    def move_pin(self, old: Node, new: Node) -> None:
        """A request's tree insert moved it to ``new`` (SGLang re-locks the new last node, which pins its
        mamba state, and unlocks the old one); its running slot stays."""
        if self.on and old is not new:
            old.mamba_lock -= 1
            new.mamba_lock += 1
            self.refresh(old)
            self.refresh(new)

    def end_request(self, node: Node) -> None:
        if self.on and self.running > 0:
            self.running -= 1
            node.mamba_lock -= 1
            self.refresh(node)

    def insert_length(self, length: int, page: int) -> int:
        """With extra_buffer only tracked states exist: an insert stops at the last track point."""
        if not self.on or not self.interval:
            return length
        step = max(self.interval // page, 1) * page
        return length // step * step

    def segment_ends(self, start: int, end: int, page: int) -> list[int]:
        """Where newly inserted nodes end: every track interval (extra_buffer), and at ``end``."""
        if end <= start:
            return []
        if not self.on or not self.interval:
            return [end]
        step = max(self.interval // page, 1) * page
        return [*range((start // step + 1) * step, end, step), end]

    def anchor(self, node: Node) -> None:
        """Give ``node`` a device anchor (the state at its end), evicting the LRU anchor if needed."""
        if not self.on or node.mamba_gpu:
            return
        if self.used >= self.slots and not self._evict_one():
            return
        node.mamba_gpu = True
        self.cached += 1
        self.refresh(node)

    def backup(self, node: Node) -> None:
        """Copy ``node``'s device anchor to a host slot (part of a KV backup), if any slot can be had."""
        if not self.on or not node.mamba_gpu or node.mamba_host:
            return
        if self.host_used >= self.host_slots and not self._evict_host_one():
            return
        node.mamba_host = True
        self.host_used += 1
        self.refresh(node)

    def drop_gpu(self, node: Node) -> None:
        if node.mamba_gpu:
            node.mamba_gpu = False
            self.cached -= 1
            self.refresh(node)

    def forget(self, node: Node) -> None:
        """``node`` leaves the tree: free both of its anchors."""
        self.drop_gpu(node)
        if node.mamba_host:
            node.mamba_host = False
            self.host_used -= 1
        self._gpu_lru.discard(node)
        self._host_lru.discard(node)

    def _evict_one(self) -> bool:
        node = self._gpu_lru.pop()
        if node is None:
            return False
        if node.gpu_children == 0 and node.lock_ref == 0:
            self._evict_leaf(node)
        else:
            self.drop_gpu(node)
        return True

    def _evict_host_one(self) -> bool:
        node = self._host_lru.pop()
        if node is None:
            return False
        if not node.gpu and not node.children and node.lock_ref == 0:
            self._delete(node)
        else:
            node.mamba_host = False
            self.host_used -= 1
            self.refresh(node)
        return True
