"""The emulated radix tree's nodes and pool accounting (``Tree``), used by ``emulator/radix.py``.

Every change of a node's tier, lock or access time goes through ``Tree``, so the page counters (GPU tree
pages, host pages, reserved pages, unlocked GPU pages) and the two eviction indexes (unlocked GPU
leaves; unlocked host-only leaves, both ``LruIndex``) stay exact without any scan. GPU residency is
tree-closed (a GPU node's ancestors are on GPU); so is presence in the tree. A ``NodeWatcher`` (the
hybrid anchor pools) hears about every node change; ``TreeEvents`` (the KV-event recorder,
``emulator/kv_recorder.py``, when events are published) hears when a node goes onto or off a tier.

Matching an edge (``_common_pages``) compares slices of about ``_CHUNK`` tokens, then binary-searches the
first differing chunk: work proportional to the shared length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from emulator.radix_node import LruIndex, Node
from emulator.storage import PageHash


class NodeWatcher(Protocol):
    """Told about every node change (the hybrid anchor pools keep their own indexes)."""

    def refresh(self, node: Node) -> None: ...

    def forget(self, node: Node) -> None: ...


class TreeEvents(Protocol):
    """Told when a node reaches GPU, leaves GPU but stays (demotion), reaches host, or leaves the tree."""

    def gpu_on(self, node: Node) -> None: ...

    def gpu_off(self, node: Node) -> None: ...

    def host_on(self, node: Node) -> None: ...

    def deleted(self, node: Node) -> None: ...


class Tree:
    """Nodes and pool accounting. Every change of a node's tier, lock or access time goes through here,
    so the page counters (GPU tree pages, host pages, reserved pages, unlocked GPU pages) and the two
    eviction indexes (unlocked GPU leaves; unlocked host-only leaves) stay exact without any scan.
    GPU residency is tree-closed (a GPU node's ancestors are on GPU); so is presence in the tree."""

    def __init__(
        self,
        page: int,
        gpu_cap: int,
        host_cap: int,
        watcher: NodeWatcher | None = None,
        events: TreeEvents | None = None,
    ) -> None:
        self.page, self.gpu_cap, self.host_cap = page, gpu_cap, host_cap
        self.watcher, self.events = watcher, events
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
            root = self.roots[extra_key] = Node(self._next_uid(), None, (), 0, gpu=True, ns=extra_key)
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
        node = Node(self._next_uid(), parent, key, parent.depth + len(key), hashes=hashes, ns=parent.ns)
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
        top.ev_hashes, node.ev_hashes, top.ns = node.ev_hashes[:pages], node.ev_hashes[pages:], node.ns
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
        if self.events is not None:
            (self.events.gpu_on if on else self.events.gpu_off)(node)

    def set_host(self, node: Node) -> None:
        if not node.host:
            node.host = True
            self.host_pages += self.pages(node)
            self.refresh(node)
            if self.events is not None:
                self.events.host_on(node)

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
            if self.events is not None:
                self.events.deleted(n)
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
