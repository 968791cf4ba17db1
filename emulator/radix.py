"""The emulated replica's paged radix cache with GPU / host / storage tiers (SGLang 0.5.10 HiRadixCache).

Units are tokens; memory is counted in pages of ``page_size`` tokens. Each ``Node`` is an edge of whole
pages and lives on GPU, in host memory (HiCache), or both. Children are found by their first page, and
each ``extra_key`` has its own root, so namespaces never share a prefix. Nothing here is asynchronous.

Request path (all O(matched length / page_size), no scans of the whole tree):

1. ``match`` walks from the root and splits the usable prefix into GPU tokens, then host-only tokens,
   then tokens of the following pages found in storage (chained page hashes, ``emulator/storage.py``).
   Like SGLang it matches at most ``len(tokens) - 1`` tokens (the last token is always computed), page
   aligned. Host loads below ``load_back_threshold`` and storage hits below ``prefetch_threshold`` count
   as 0 (they are recomputed). Hybrid models stop at the deepest node holding a recurrent-state anchor.
2. ``admit`` checks that the GPU can hold the host load, the storage prefetch and the reservation after
   evicting every unlocked page (else ``None``, nothing changed); then it splits a partly matched node,
   locks the path, evicts, loads host pages back (the host copy stays), prefetches storage pages as a new
   node and reserves room. The engine sizes the reservation with ``match`` first, so the last lookup of a
   prompt tuple is remembered and reused until anything it depends on changes (every tree mutation and
   every storage write clears it): one walk per admission, not two (``emulator/radix_lookup.py``).
3. ``insert_unfinished`` (SGLang ``cache_unfinished_req``, after every prefill chunk and once the prefill
   is complete) inserts the whole pages computed so far, so a request admitted later already hits them
   while this one still runs. The request's lock moves from the node it held to the deepest inserted node
   (the path above stays locked: locks pin whole paths), and the pages it computed leave its reservation:
   they now live in the tree (pages another request inserted first are the duplicates SGLang frees), so
   GPU usage is never counted twice. Hits count only when ``chunked`` is False: an intermediate chunk's
   insert does not count; the insert after the last chunk does, on every node of the path. (Read
   literally, as SGLang 0.5.10 does: a request that decodes counts a hit on its prompt's nodes here and
   another one at ``finish``, so write_through_selective backs up a prompt served once with >1 token.)
4. ``finish`` releases the reservation, inserts prompt + output (whole pages; the part already inserted is
   found, hit and kept, only the remainder is new), applies the write policy (hit counts), and unlocks.
   ``abort`` only releases and unlocks: pages already inserted stay cached, as in SGLang.

Write policies (``_hit``): write_through backs a node up to host on its first hit (its insert),
write_through_selective on its second, write_back never proactively. GPU eviction (``_evict_leaf``) takes
unlocked GPU leaves in LRU order (a logical clock ticks once per touched node): a backed-up node is
demoted (GPU pages freed, host copy kept); under write_back an un-backed-up one is first copied to host;
otherwise it is deleted. Host eviction deletes host-only leaves in LRU order. A backup that finds no host
room after host eviction fails (the node stays GPU-only). With storage, every host backup is also written
through to storage. Recurrent-state anchors (hybrid GDN/Mamba models) live in ``emulator/hybrid.py``.

KV events (``--kv-events-config``): the tree tells a ``KvRecorder`` (``emulator/kv_recorder.py``) when a
node reaches or leaves a tier, and ``flush`` / ``restart`` queue ``AllBlocksCleared``.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from emulator.cache_values import Admission, CacheConfig, CacheStats, Lock, MatchResult
from emulator.hybrid import Anchors
from emulator.kv_recorder import KvRecorder
from emulator.radix_lookup import Lookup, Lookups
from emulator.radix_node import Node
from emulator.radix_tree import Tree
from emulator.storage import PageHash, chain_hashes

__all__ = ["Admission", "CacheConfig", "CacheStats", "MatchResult", "RadixCache"]


class RadixCache:
    """One replica's KV cache. See the module docstring for the algorithm."""

    def __init__(self, config: CacheConfig, events: KvRecorder | None = None) -> None:
        self.cfg = config
        self.events = events
        self.page = config.page_size
        self._gpu_cap = config.gpu_tokens // self.page
        self._host_cap = config.host_tokens // self.page if config.hicache else 0
        self._threshold = 1 if config.write_policy == "write_through" else 2
        self._generation = 0
        self._totals = dict.fromkeys(_TOTALS, 0)
        self._reset()

    # ---- public API -------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> MatchResult:
        lk = self.lookups.find(tokens, extra_key)
        return MatchResult(lk.gpu_tokens, lk.host_tokens, len(lk.storage) * self.page)

    def admit(self, tokens: Sequence[int], extra_key: str | None, reserve_tokens: int) -> Admission | None:
        lk = self.lookups.find(tokens, extra_key)
        need = (lk.host_tokens // self.page) + len(lk.storage) + self.tree.pages_for(reserve_tokens)
        pinned = sum(self.tree.pages(n) for n in lk.path if n.gpu and n.lock_ref == 0)
        if lk.partial is not None and lk.partial.gpu and lk.partial.lock_ref == 0:
            pinned += lk.partial_pages
        if need > self.tree.gpu_free() + self.tree.evictable - pinned or not self.anchors.can_run(lk.path):
            return None
        self.lookups.forget()
        path = list(lk.path)
        if lk.partial is not None:
            path.append(self.tree.split(lk.partial, lk.partial_pages))
        deepest = path[-1] if path else self.tree.root(extra_key)
        self.tree.lock(deepest)
        for n in path:
            self.tree.touch(n)
        anchor = deepest
        self.anchors.start_request(anchor)
        self._evict_gpu(need)
        for n in path:
            if not n.gpu:
                self.tree.set_gpu(n, True)
        if lk.storage:
            deepest = self._prefetch(deepest, lk, extra_key)
        self.tree.reserved += self.tree.pages_for(reserve_tokens)
        self._active += 1
        self._count(lk)
        cached = lk.gpu_tokens + lk.host_tokens + len(lk.storage) * self.page
        lock = Lock(deepest, anchor, reserve_tokens, self._generation)
        return Admission(lk.gpu_tokens, lk.host_tokens, len(lk.storage) * self.page, cached, lock)

    def extend(self, adm: Admission, tokens: int) -> bool:
        lock = adm.lock
        if lock.released or lock.generation != self._generation or tokens < 0:
            return False
        more = self.tree.pages_for(lock.reserved_tokens + tokens) - self.tree.pages_for(lock.reserved_tokens)
        if more > self.tree.gpu_free() + self.tree.evictable:
            return False
        self.lookups.forget()
        self._evict_gpu(more)
        self.tree.reserved += more
        lock.reserved_tokens += tokens
        return True

    def insert_unfinished(
        self, adm: Admission, tokens_done: Sequence[int], extra_key: str | None, chunked: bool
    ) -> int:
        """Insert the request's prefix computed so far (whole pages) and keep it locked by the request;
        see the module docstring (step 3). Returns the tokens the request now holds in the tree."""
        lock = adm.lock
        if lock.released or lock.generation != self._generation:
            return 0
        p, held = self.page, lock.node.depth
        length = self.anchors.insert_length(len(tokens_done) // p * p, p)
        if length <= held:
            return held
        before = self.tree.pages_for(lock.reserved_tokens)
        lock.reserved_tokens = max(0, lock.reserved_tokens - (length - held))
        self.tree.reserved -= before - self.tree.pages_for(lock.reserved_tokens)
        node = self._insert(tokens_done[:length], extra_key, chunked)
        if node.depth > held:
            self.tree.lock(node)
            self.tree.unlock(lock.node)
            self.anchors.move_pin(lock.anchor, node)
            lock.node = lock.anchor = node
        return lock.node.depth

    def finish(self, adm: Admission, tokens: Sequence[int], extra_key: str | None) -> None:
        if self._release(adm.lock):
            self._insert(tokens, extra_key, chunked=False)
            self.tree.unlock(adm.lock.node)

    def abort(self, adm: Admission) -> None:
        if self._release(adm.lock):
            self.tree.unlock(adm.lock.node)

    def flush(self) -> bool:
        if self._active:
            return False
        self._reset()
        if self.events is not None:
            self.events.cleared()
        return True

    def restart(self) -> None:
        self._generation += 1
        self._reset()
        if self.events is not None:
            self.events.cleared()

    def stats(self) -> CacheStats:
        p, t = self.page, self._totals
        storage = self.cfg.storage
        return CacheStats(
            gpu_capacity=self._gpu_cap * p,
            gpu_used=(self.tree.gpu_pages + self.tree.reserved) * p,
            gpu_cached=self.tree.gpu_pages * p,
            gpu_evictable=self.tree.evictable * p,
            host_capacity=self._host_cap * p,
            host_used=self.tree.host_pages * p,
            storage_used=storage.used_tokens if storage is not None else 0,
            mamba_used=self.anchors.used,
            mamba_host_used=self.anchors.host_used,
            **t,
        )

    def snapshot(self) -> dict[str, object]:
        """True state for the debug endpoint: pages per tier; every leaf as (first-page hash, depth, tier)."""
        leaves = [
            (xxhash.xxh64_hexdigest(repr((ns, top.key[: self.page])).encode()), n.depth, _tier(n))
            for ns, top, n in self.tree.nodes()
            if not n.children
        ]
        return {
            "page_size": self.page,
            "gpu_pages": self.tree.gpu_pages,
            "host_pages": self.tree.host_pages,
            "reserved_pages": self.tree.reserved,
            "storage_pages": len(self.cfg.storage) if self.cfg.storage is not None else 0,
            "leaves": sorted(leaves),
        }

    def _prefetch(self, parent: Node, lk: Lookup, extra_key: str | None) -> Node:
        start = lk.gpu_tokens + lk.host_tokens
        key = lk.key[start : start + len(lk.storage) * self.page]
        node = self.tree.new_node(parent, key, tuple(lk.storage))
        assert self.cfg.storage is not None
        self.cfg.storage.touch(lk.storage)
        self.tree.set_gpu(node, True)
        self.tree.lock(node)
        self.tree.unlock(parent)
        self._hit(node)
        return node

    def _count(self, lk: Lookup) -> None:
        t, stored = self._totals, len(lk.storage) * self.page
        t["gpu_hit_tokens_total"] += lk.gpu_tokens
        t["host_hit_tokens_total"] += lk.host_tokens
        t["load_back_tokens_total"] += lk.host_tokens
        t["storage_hit_tokens_total"] += stored
        t["prefetched_tokens_total"] += stored

    # ---- insert (cache_unfinished_req / cache_finished_req) ---------------------------------------
    def _insert(self, tokens: Sequence[int], extra_key: str | None, chunked: bool) -> Node:
        """Insert the whole pages of ``tokens``; hit counts unless ``chunked``. Returns the deepest node
        reached (the root if nothing could be placed)."""
        self.lookups.forget()
        p = self.page
        key = tuple(tokens[: self.anchors.insert_length(len(tokens) // p * p, p)])
        root = self.tree.root(extra_key)
        path, partial, ppages = self.tree.walk(root, key)
        if partial is not None:
            path.append(self.tree.split(partial, ppages))
        top = path[-1] if path else root
        self.tree.lock(top)  # protect the path while making room
        budget = self._make_room(
            sum(self.tree.pages(n) for n in path if not n.gpu) + (len(key) - top.depth) // p
        )
        node = root
        for n in path:
            if not n.gpu:
                if budget < self.tree.pages(n):
                    self.tree.unlock(top)
                    return node
                budget -= self.tree.pages(n)
                self.tree.set_gpu(n, True)
            self.tree.touch(n)
            self._hit(n, chunked)
            node = n
        end = node.depth + budget * p
        for seg_end in self.anchors.segment_ends(node.depth, end, p):
            seg = key[node.depth : seg_end]
            node = self.tree.new_node(node, seg, self._hashes(node, seg, extra_key))
            self.tree.set_gpu(node, True)
            self.anchors.anchor(node)
            self._hit(node, chunked)
        if node is not root:
            self.anchors.anchor(node)
        self.tree.unlock(top)
        return node

    def _make_room(self, pages: int) -> int:
        self._evict_gpu(pages)
        return min(pages, self.tree.gpu_free())

    def _hit(self, node: Node, chunked: bool = False) -> None:
        """SGLang ``_inc_hit_count``: count a hit and back the node up once it reaches the threshold
        (never for an intermediate chunk's insert)."""
        if chunked or not self.cfg.hicache or self.cfg.write_policy == "write_back":
            return
        node.hit_count += 1
        if not node.host and node.hit_count >= self._threshold:
            self._backup(node)

    # ---- tiers ------------------------------------------------------------------------------------
    def _backup(self, node: Node) -> bool:
        """Device -> host copy (and write-through to storage). False if the host has no room."""
        pages = self.tree.pages(node)
        if self.tree.host_free() < pages:
            self._evict_host(pages)
        if self.tree.host_free() < pages:
            return False
        self.tree.set_host(node)
        self._totals["backuped_tokens_total"] += len(node.key)
        if self.cfg.storage is not None:
            self.cfg.storage.put(node.hashes, self.page)
        self.anchors.backup(node)
        return True

    def _evict_gpu(self, pages: int) -> None:
        while self.tree.gpu_free() < pages:
            node = self.tree.gpu_lru.pop()
            if node is None:
                return
            self._evict_leaf(node)

    def _evict_leaf(self, node: Node) -> None:
        self._totals["evicted_tokens_total"] += len(node.key)
        write_back = self.cfg.hicache and self.cfg.write_policy == "write_back"
        if node.host or (write_back and self._backup(node)):
            self.anchors.drop_gpu(node)
            self.tree.set_gpu(node, False)
        else:
            self.tree.delete(node)

    def _evict_host(self, pages: int) -> None:
        while self.tree.host_free() < pages:
            node = self.tree.host_lru.pop()
            if node is None:
                return
            self.tree.delete(node)

    # ---- state ------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.tree = Tree(self.page, self._gpu_cap, self._host_cap, events=self.events)
        self.anchors = Anchors(self.cfg, self._evict_leaf, self.tree.delete)
        self.tree.watcher = self.anchors
        self.lookups = Lookups(self.cfg, self.tree, self.anchors)
        self._active = 0

    def _release(self, lock: Lock) -> bool:
        """Give back an admission's reservation and running slot; False if already released or stale."""
        if lock.released or lock.generation != self._generation:
            lock.released = True
            return False
        lock.released = True
        self._active -= 1
        self.tree.reserved -= self.tree.pages_for(lock.reserved_tokens)
        self.anchors.end_request(lock.anchor)
        return True

    def _hashes(self, parent: Node, key: tuple[int, ...], extra_key: str | None) -> tuple[PageHash, ...]:
        if self.cfg.storage is None:
            return ()
        return tuple(chain_hashes(parent.last_hash(), key, self.page, extra_key))


_TOTALS = (
    "evicted_tokens_total",
    "load_back_tokens_total",
    "backuped_tokens_total",
    "prefetched_tokens_total",
    "host_hit_tokens_total",
    "gpu_hit_tokens_total",
    "storage_hit_tokens_total",
)


def _tier(node: Node) -> str:
    return "gpu+host" if node.gpu and node.host else "gpu" if node.gpu else "host"
