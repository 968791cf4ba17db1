"""Building blocks of the emulated radix tree: ``Node`` (one edge) and ``LruIndex`` (eviction order).

- ``Node``: one radix-tree edge (a run of whole pages) with its tier flags, lock count, hit count, LRU
  clock, (hybrid models) recurrent-state anchors on GPU / host, and the page digests its KV events
  name it by (when events are published).
- ``LruIndex``: a min-heap of nodes by last access with lazy deletion. Membership is explicit (``add`` /
  ``discard``); a node touched again is re-pushed and its old entry becomes stale. ``pop`` returns the
  least recently used member in O(log n) amortised; the heap is rebuilt when stale entries outnumber
  members, so memory stays O(members). This is what keeps eviction free of whole-tree scans.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from emulator.storage import PageHash


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
    ns: str | None = None  # the cache namespace (extra_key) of the root it hangs from
    ev_hashes: tuple[bytes, ...] = ()  # KV-event page digests (emulator/kv_recorder.py), once published

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
