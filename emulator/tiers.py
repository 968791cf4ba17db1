"""Value types and building blocks of the emulated radix cache (see ``emulator/radix.py``).

- ``CacheConfig``: the cache's shape (pool sizes in tokens, page size, write policy, storage, hybrid).
- ``MatchResult`` / ``Admission`` / ``CacheStats``: what the cache reports.
- ``Node``: one radix-tree edge (a run of whole pages) with its tier flags, lock count, hit count, LRU
  clock and (hybrid models) recurrent-state anchors on GPU / host.
- ``LruIndex``: a min-heap of nodes by last access with lazy deletion. Membership is explicit (``add`` /
  ``discard``); a node touched again is re-pushed and its old entry becomes stale. ``pop`` returns the
  least recently used member in O(log n) amortised; the heap is rebuilt when stale entries outnumber
  members, so memory stays O(members). This is what keeps eviction free of whole-tree scans.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from emulator.storage import PageHash, Storage

WritePolicyName = Literal["write_back", "write_through", "write_through_selective"]
WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through", "write_through_selective")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Sizes are in tokens; the pools hold ``tokens // page_size`` pages."""

    gpu_tokens: int
    page_size: int = 1
    hicache: bool = False
    host_tokens: int = 0
    write_policy: str = "write_through"
    storage: Storage | None = None
    load_back_threshold: int = 10
    prefetch_threshold: int = 256
    hybrid: bool = False
    mamba_slots: int = 0
    host_mamba_slots: int = 0
    mamba_track_interval: int = 256
    mamba_extra_buffer: bool = False

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.gpu_tokens < self.page_size:
            raise ValueError("gpu_tokens must hold at least one page")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, not {self.write_policy!r}")
        if self.hybrid and self.mamba_slots < 1:
            raise ValueError("a hybrid cache needs mamba_slots >= 1")
        if self.mamba_track_interval < 1:
            raise ValueError("mamba_track_interval must be >= 1")


@dataclass(frozen=True, slots=True)
class MatchResult:
    """A pure peek: the usable prefix split by tier (what ``admit`` would use right now)."""

    gpu_tokens: int
    host_tokens: int
    storage_tokens: int

    @property
    def total(self) -> int:
        return self.gpu_tokens + self.host_tokens + self.storage_tokens


class Lock:
    """The mutable part of an admission: the locked path's deepest node, the recurrent-state anchor it
    pins (hybrid), its GPU reservation, and the cache generation (a restart voids old locks). The node's
    depth is the prefix the request holds in the tree: the match at admission, then whatever it inserted
    while unfinished (node and anchor move down, the reservation shrinks by the pages inserted)."""

    __slots__ = ("anchor", "generation", "node", "released", "reserved_tokens")

    def __init__(self, node: Node, anchor: Node, reserved_tokens: int, generation: int) -> None:
        self.node = node
        self.anchor = anchor
        self.reserved_tokens = reserved_tokens
        self.generation = generation
        self.released = False


@dataclass(frozen=True, slots=True)
class Admission:
    """One admitted request: what it reused from each tier, and its lock handle (opaque to callers)."""

    gpu_hit_tokens: int
    host_loaded_tokens: int
    storage_loaded_tokens: int
    cached_tokens: int
    lock: Lock = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class CacheStats:
    gpu_capacity: int
    gpu_used: int
    gpu_cached: int
    gpu_evictable: int
    host_capacity: int
    host_used: int
    storage_used: int
    evicted_tokens_total: int
    load_back_tokens_total: int
    backuped_tokens_total: int
    prefetched_tokens_total: int
    host_hit_tokens_total: int
    gpu_hit_tokens_total: int
    storage_hit_tokens_total: int
    mamba_used: int
    mamba_host_used: int


@dataclass(eq=False, slots=True)
class Node:
    """A radix edge. ``key`` is a whole number of pages; ``depth`` counts tokens from the root to its end."""

    uid: int
    parent: Node | None
    key: tuple[int, ...]
    depth: int
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    gpu: bool = False
    host: bool = False
    lock_ref: int = 0
    last_access: int = 0
    hit_count: int = 0
    gpu_children: int = 0
    mamba_gpu: bool = False
    mamba_host: bool = False
    mamba_lock: int = 0  # running requests resuming from this node's anchor
    hashes: tuple[PageHash, ...] = ()

    @property
    def start(self) -> int:
        return self.depth - len(self.key)

    def last_hash(self, pages: int | None = None) -> PageHash:
        """The chained storage hash after ``pages`` pages of this node (all by default)."""
        if pages is None:
            return self.hashes[-1] if self.hashes else b""
        if pages == 0:
            return self.parent.last_hash() if self.parent is not None else b""
        return self.hashes[pages - 1]


class LruIndex:
    """Members ordered by ``Node.last_access`` (ties by uid); lazy-deletion heap."""

    __slots__ = ("_heap", "_members")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Node]] = []
        self._members: dict[Node, int] = {}

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node: Node) -> bool:
        return node in self._members

    def set(self, node: Node, member: bool) -> None:
        if member:
            self.add(node)
        else:
            self.discard(node)

    def add(self, node: Node) -> None:
        if self._members.get(node) == node.last_access:
            return
        self._members[node] = node.last_access
        heapq.heappush(self._heap, (node.last_access, node.uid, node))
        if len(self._heap) > 2 * len(self._members) + 64:
            self._heap = [(t, n.uid, n) for n, t in self._members.items()]
            heapq.heapify(self._heap)

    def discard(self, node: Node) -> None:
        self._members.pop(node, None)

    def pop(self) -> Node | None:
        while self._heap:
            clock, _, node = heapq.heappop(self._heap)
            if self._members.get(node) == clock:
                del self._members[node]
                return node
        return None

    def clear(self) -> None:
        self._heap.clear()
        self._members.clear()


class NodeWatcher(Protocol):
    """Told about every node change (the hybrid anchor pools keep their own indexes)."""

    def refresh(self, node: Node) -> None: ...

    def forget(self, node: Node) -> None: ...


class Tree:
    """Nodes and pool accounting. Every change of a node's tier, lock or access time goes through here,
    so the page counters (GPU tree pages, host pages, reserved pages, unlocked GPU pages) and the two
    eviction indexes (unlocked GPU leaves; unlocked host-only leaves) stay exact without any scan.
    GPU residency is tree-closed (a GPU node's ancestors are on GPU); so is presence in the tree."""

    def __init__(self, page: int, gpu_cap: int, host_cap: int, watcher: NodeWatcher | None = None) -> None:
        self.page, self.gpu_cap, self.host_cap = page, gpu_cap, host_cap
        self.watcher = watcher
        self.roots: dict[str | None, Node] = {}
        self.gpu_pages = self.host_pages = self.reserved = self.evictable = 0
        self.gpu_lru, self.host_lru = LruIndex(), LruIndex()
        self._clock = self._uid = 0

    def pages(self, node: Node) -> int:
        return len(node.key) // self.page

    def pages_for(self, tokens: int) -> int:
        return -(-max(tokens, 0) // self.page)

    def gpu_free(self) -> int:
        return self.gpu_cap - self.gpu_pages - self.reserved

    def host_free(self) -> int:
        return self.host_cap - self.host_pages

    def root(self, extra_key: str | None) -> Node:
        root = self.roots.get(extra_key)
        if root is None:
            root = self.roots[extra_key] = Node(self._next_uid(), None, (), 0, gpu=True)
        return root

    def walk(self, root: Node | None, key: tuple[int, ...]) -> tuple[list[Node], Node | None, int]:
        """Fully matched nodes, then the node matched only partly (or None) and its matched pages."""
        path: list[Node] = []
        node, pos, p = root, 0, self.page
        while node is not None and pos < len(key):
            child = node.children.get(key[pos : pos + p])
            if child is None:
                break
            n = len(child.key)
            if n > len(key) - pos or key[pos : pos + n] != child.key:
                return path, child, _common_pages(child.key, key, pos, p)
            path.append(child)
            node, pos = child, pos + n
        return path, None, 0

    def new_node(self, parent: Node, key: tuple[int, ...], hashes: tuple[PageHash, ...]) -> Node:
        node = Node(self._next_uid(), parent, key, parent.depth + len(key), hashes=hashes)
        parent.children[key[: self.page]] = node
        self.touch(node)
        return node

    def split(self, node: Node, pages: int) -> Node:
        """Cut ``node`` after ``pages`` pages; the new upper node is returned (anchors stay below)."""
        parent, n = node.parent, pages * self.page
        assert parent is not None and 0 < n < len(node.key)
        top = Node(self._next_uid(), parent, node.key[:n], node.start + n, gpu=node.gpu, host=node.host)
        top.lock_ref, top.last_access, top.hit_count = node.lock_ref, node.last_access, node.hit_count
        top.hashes, node.hashes = node.hashes[:pages], node.hashes[pages:]
        top.gpu_children = int(node.gpu)
        node.key, node.parent = node.key[n:], top
        top.children[node.key[: self.page]] = node
        parent.children[top.key[: self.page]] = top
        self.refresh(top)
        return top

    def set_gpu(self, node: Node, on: bool) -> None:
        if node.gpu == on:
            return
        sign, pages = (1 if on else -1), self.pages(node)
        node.gpu = on
        self.gpu_pages += sign * pages
        self.evictable += sign * pages if not node.lock_ref else 0
        if node.parent is not None:
            node.parent.gpu_children += sign
            self.refresh(node.parent)
        self.refresh(node)

    def set_host(self, node: Node) -> None:
        if not node.host:
            node.host = True
            self.host_pages += self.pages(node)
            self.refresh(node)

    def lock(self, node: Node) -> None:
        """Lock ``node`` and every ancestor (a lock pins a whole path)."""
        n: Node | None = node
        while n is not None and n.parent is not None:
            if n.lock_ref == 0 and n.gpu:
                self.evictable -= self.pages(n)
            n.lock_ref += 1
            self.refresh(n)
            n = n.parent

    def unlock(self, node: Node) -> None:
        n: Node | None = node
        while n is not None and n.parent is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0 and n.gpu:
                self.evictable += self.pages(n)
            self.refresh(n)
            n = n.parent

    def touch(self, node: Node) -> None:
        self._clock += 1
        node.last_access = self._clock
        self.refresh(node)

    def delete(self, node: Node) -> None:
        """Remove ``node`` and its (host-only) subtree, freeing every tier it uses."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[: self.page]]
        if node.gpu:
            parent.gpu_children -= 1
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self.gpu_pages -= self.pages(n) if n.gpu else 0
            self.evictable -= self.pages(n) if n.gpu and not n.lock_ref else 0
            self.host_pages -= self.pages(n) if n.host else 0
            if self.watcher is not None:
                self.watcher.forget(n)
            self.gpu_lru.discard(n)
            self.host_lru.discard(n)
        self.refresh(parent)

    def refresh(self, node: Node) -> None:
        """Re-file ``node`` in the eviction indexes after any change to it."""
        if node.parent is None:
            return
        free = node.lock_ref == 0
        self.gpu_lru.set(node, free and node.gpu and node.gpu_children == 0)
        self.host_lru.set(node, free and node.host and not node.gpu and not node.children)
        if self.watcher is not None:
            self.watcher.refresh(node)

    def nodes(self) -> Iterator[tuple[str | None, Node, Node]]:
        """Every node as (namespace, top-level ancestor, node); O(tree), for debugging only."""
        for ns, root in self.roots.items():
            for top in root.children.values():
                stack = [top]
                while stack:
                    n = stack.pop()
                    stack.extend(n.children.values())
                    yield ns, top, n

    def _next_uid(self) -> int:
        self._uid += 1
        return self._uid


_CHUNK = 1024
"""Tokens compared per slice in ``_common_pages`` (large enough to amortise the loop, small enough that
the search inside a differing chunk is cheap)."""


def _common_pages(node_key: tuple[int, ...], key: tuple[int, ...], pos: int, page: int) -> int:
    """Whole pages shared by ``node_key`` and ``key[pos:]`` (the first page is known to match).

    A linear scan in chunks of about ``_CHUNK`` tokens (each a slice comparison done in C, which stops at
    the first differing token), then a binary search over the pages of the first chunk that differs: the
    work is proportional to the shared length, not to ``log(n)`` comparisons of the whole edge.
    """
    end = min(len(node_key), len(key) - pos) // page * page
    step = max(1, _CHUNK // page) * page
    lo = 0
    while lo < end:
        hi = min(lo + step, end)
        if node_key[lo:hi] != key[pos + lo : pos + hi]:
            return _first_differing_page(node_key, key, pos, page, lo, hi)
        lo = hi
    return end // page


def _first_differing_page(
    node_key: tuple[int, ...], key: tuple[int, ...], pos: int, page: int, lo: int, hi: int
) -> int:
    """Pages shared when ``[0, lo)`` is known to match and ``[lo, hi)`` is known to differ somewhere."""
    good, bad = lo // page, hi // page  # pages [0, good) match; some page in [good, bad) differs
    while bad - good > 1:
        mid = (good + bad) // 2
        a, b = good * page, mid * page
        if node_key[a:b] == key[pos + a : pos + b]:
            good = mid
        else:
            bad = mid
    return good
