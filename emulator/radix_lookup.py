"""The lookup of a prompt in the emulated radix cache (``emulator/radix.py``): a pure walk, remembered.

``Lookups.find(tokens, extra_key)`` walks the tree (``Tree.walk``) over the usable prefix: at most
``len(tokens) - 1`` tokens, page aligned (the last token is always computed). The matched path splits
into GPU tokens (GPU residency is tree-closed, so those lead the path), then host-only tokens; a node
matched only partly adds its matched pages to the tier it is on. Host hits below
``load_back_threshold`` are dropped (recomputed instead of loaded). Hybrid models cut the path at its
deepest recurrent-state anchor (``Anchors.cut``). Then the pages after the match are looked up in
storage by chained hash while present; fewer than ``prefetch_threshold`` tokens count as none.

The last lookup of a prompt tuple is remembered and reused while neither the tree nor the storage
changed (the cache calls ``forget`` on every mutation; the storage has a version): ``match`` then
``admit`` walk once, not twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emulator.cache_values import CacheConfig
from emulator.hybrid import Anchors
from emulator.radix_node import Node
from emulator.radix_tree import Tree
from emulator.storage import PageHash, chain_hashes


@dataclass(slots=True)
class Lookup:
    """Where a prompt's usable prefix lies: the nodes it would use, per tier, and the storage pages after."""

    key: tuple[int, ...]
    path: list[Node]  # fully matched nodes that will be used (GPU part, then host part)
    partial: Node | None  # a node matched only for its first ``partial_pages`` pages (last on the path)
    partial_pages: int
    gpu_tokens: int
    host_tokens: int
    storage: list[PageHash]  # pages to prefetch, in order


@dataclass(frozen=True, slots=True)
class _Memo:
    """The last lookup and what it depended on besides the tree (which clears it on every change)."""

    tokens: tuple[int, ...]
    extra_key: str | None
    storage: int  # the storage tier's version
    lookup: Lookup


class Lookups:
    """Lookups in one tree (a cache reset builds a new one with the new tree)."""

    def __init__(self, cfg: CacheConfig, tree: Tree, anchors: Anchors) -> None:
        self.cfg = cfg
        self.page = cfg.page_size
        self.tree = tree
        self.anchors = anchors
        self._memo: _Memo | None = None

    def forget(self) -> None:
        """The tree changed: the remembered lookup is stale."""
        self._memo = None

    def find(self, tokens: Sequence[int], extra_key: str | None) -> Lookup:
        """The lookup of ``tokens``, reused when the same prompt object is looked up again (``match`` then
        ``admit``) and neither the cache nor its storage changed in between; every mutation clears it."""
        storage = self.cfg.storage.version if self.cfg.storage is not None else 0
        memo = self._memo
        if (
            memo is not None
            and memo.tokens is tokens
            and memo.extra_key == extra_key
            and memo.storage == storage
        ):
            return memo.lookup
        lk = self._walk(tokens, extra_key)
        if isinstance(tokens, tuple):  # immutable: identity implies the same content
            self._memo = _Memo(tokens, extra_key, storage, lk)
        return lk

    def _walk(self, tokens: Sequence[int], extra_key: str | None) -> Lookup:
        usable = max(len(tokens) - 1, 0) // self.page * self.page
        key = tuple(tokens[:usable])
        path, partial, ppages = self.tree.walk(self.tree.roots.get(extra_key), key)
        if self.cfg.hybrid:
            path, partial, ppages = self.anchors.cut(path), None, 0
        lk = Lookup(key, path, partial, ppages, 0, 0, [])
        on_gpu = [n for n in path if n.gpu]  # GPU residency is tree-closed: these lead the path
        lk.gpu_tokens = sum(len(n.key) for n in on_gpu)
        lk.host_tokens = sum(len(n.key) for n in path) - lk.gpu_tokens
        if partial is not None and partial.gpu and len(on_gpu) == len(path):
            lk.gpu_tokens += ppages * self.page
        elif partial is not None:
            lk.host_tokens += ppages * self.page
        if 0 < lk.host_tokens < self.cfg.load_back_threshold:  # too short to load: recomputed instead
            lk.path, lk.partial, lk.partial_pages, lk.host_tokens = on_gpu, None, 0, 0
            return lk
        lk.storage = self._storage_hits(lk, extra_key)
        return lk

    def _storage_hits(self, lk: Lookup, extra_key: str | None) -> list[PageHash]:
        storage = self.cfg.storage
        if storage is None or self.cfg.hybrid:
            return []
        end = lk.gpu_tokens + lk.host_tokens
        if len(lk.key) - end < self.cfg.prefetch_threshold:
            return []
        if lk.partial is not None:
            parent = lk.partial.last_hash(lk.partial_pages)
        else:
            parent = lk.path[-1].last_hash() if lk.path else b""
        hits: list[PageHash] = []
        for h in chain_hashes(parent, lk.key[end:], self.page, extra_key):
            if h not in storage:
                break
            hits.append(h)
        return hits if len(hits) * self.page >= self.cfg.prefetch_threshold else []
