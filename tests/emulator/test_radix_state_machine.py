"""A hypothesis state machine: the radix cache against a naive reference model, invariants after every step.

The reference keeps segments in a plain dict keyed by (namespace, every token from the root to the
segment's end) and answers every question by scanning all of them: no heaps, no child maps, no counters.
It follows the same policy (SGLang's HiRadixCache: node-granular LRU eviction by a logical clock that
ticks once per touched node, write policies, all-or-nothing load back), so match results and pool usage
must agree exactly; the real cache's incremental bookkeeping (eviction heaps, per-node GPU-child counts,
evictable-page counter, splits) is also recomputed from scratch and compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from emulator.radix import Admission, CacheConfig, RadixCache
from emulator.radix_node import Node

Key = tuple[str | None, tuple[int, ...]]


@dataclass
class Seg:
    start: int
    gpu: bool = True
    host: bool = False
    lock: int = 0
    last: int = 0
    hits: int = 0


@dataclass
class RefAdmission:
    node: Key | None  # the deepest node the request holds (locks cover the path to the root)
    reserved: int  # pages
    tokens: int  # reserved tokens (pages are recomputed from them when a part moves into the tree)
    live: bool = True


class Reference:
    def __init__(self, gpu: int, host: int, page: int, hicache: bool, policy: str, threshold: int) -> None:
        self.gpu_cap, self.host_cap, self.page = gpu // page, host // page if hicache else 0, page
        self.hicache, self.policy, self.load_threshold = hicache, policy, threshold
        self.hit_threshold = 1 if policy == "write_through" else 2
        self.segs: dict[Key, Seg] = {}
        self.reserved = self.clock = 0
        self.active: list[RefAdmission] = []

    # -- naive queries
    def pages(self, k: Key) -> int:
        return (len(k[1]) - self.segs[k].start) // self.page

    def parent(self, k: Key) -> Key | None:
        start = self.segs[k].start
        return (k[0], k[1][:start]) if start else None

    def children(self, k: Key) -> list[Key]:
        return [c for c in self.segs if self.parent(c) == k]

    def gpu_used(self) -> int:
        return sum(self.pages(k) for k, s in self.segs.items() if s.gpu)

    def host_used(self) -> int:
        return sum(self.pages(k) for k, s in self.segs.items() if s.host)

    def free(self) -> int:
        return self.gpu_cap - self.gpu_used() - self.reserved

    def evictable(self) -> int:
        return sum(self.pages(k) for k, s in self.segs.items() if s.gpu and not s.lock)

    def walk(self, ns: str | None, key: tuple[int, ...]) -> tuple[list[Key], Key | None, int]:
        path: list[Key] = []
        pos = 0
        while pos < len(key):
            nxt = [
                k
                for k, s in self.segs.items()
                if k[0] == ns and s.start == pos and k[1][: pos + self.page] == key[: pos + self.page]
            ]
            if not nxt:
                break
            k = nxt[0]
            if key[: len(k[1])] == k[1]:
                path.append(k)
                pos = len(k[1])
                continue
            n = 0
            while k[1][: pos + (n + 1) * self.page] == key[: pos + (n + 1) * self.page] and pos + (
                n + 1
            ) * self.page <= min(len(key), len(k[1])):
                n += 1
            return path, k, n
        return path, None, 0

    def lookup(self, tokens: list[int], ns: str | None) -> tuple[list[Key], Key | None, int, int, int]:
        key = tuple(tokens[: max(len(tokens) - 1, 0) // self.page * self.page])
        path, partial, pp = self.walk(ns, key)
        gpu = [k for k in path if self.segs[k].gpu]
        g = sum(len(k[1]) - self.segs[k].start for k in gpu)
        h = sum(len(k[1]) - self.segs[k].start for k in path) - g
        if partial is not None and self.segs[partial].gpu and len(gpu) == len(path):
            g += pp * self.page
        elif partial is not None:
            h += pp * self.page
        if 0 < h < self.load_threshold:
            return gpu, None, 0, g, 0
        return path, partial, pp, g, h

    # -- naive mutations
    def touch(self, k: Key) -> None:
        self.clock += 1
        self.segs[k].last = self.clock

    def split(self, k: Key, pages: int) -> Key:
        s = self.segs[k]
        top = (k[0], k[1][: s.start + pages * self.page])
        self.segs[top] = Seg(s.start, s.gpu, s.host, s.lock, s.last, s.hits)
        s.start = len(top[1])
        return top

    def lock(self, k: Key | None, d: int) -> None:
        while k is not None:
            self.segs[k].lock += d
            k = self.parent(k)

    def delete(self, k: Key) -> None:
        for c in [c for c in self.segs if c[0] == k[0] and c[1][: len(k[1])] == k[1]]:
            del self.segs[c]

    def backup(self, k: Key) -> bool:
        if self.host_cap - self.host_used() < self.pages(k):
            self.evict_host(self.pages(k))
        if self.host_cap - self.host_used() < self.pages(k):
            return False
        self.segs[k].host = True
        return True

    def evict_gpu(self, pages: int) -> None:
        while self.free() < pages:
            leaves = [
                k
                for k, s in self.segs.items()
                if s.gpu and not s.lock and not any(self.segs[c].gpu for c in self.children(k))
            ]
            if not leaves:
                return
            k = min(leaves, key=lambda x: self.segs[x].last)
            if self.segs[k].host or (self.hicache and self.policy == "write_back" and self.backup(k)):
                self.segs[k].gpu = False
            else:
                self.delete(k)

    def evict_host(self, pages: int) -> None:
        while self.host_cap - self.host_used() < pages:
            leaves = [
                k
                for k, s in self.segs.items()
                if s.host and not s.gpu and not s.lock and not self.children(k)
            ]
            if not leaves:
                return
            self.delete(min(leaves, key=lambda x: self.segs[x].last))

    def hit(self, k: Key, chunked: bool = False) -> None:
        if not chunked and self.hicache and self.policy != "write_back":
            self.segs[k].hits += 1
            if not self.segs[k].host and self.segs[k].hits >= self.hit_threshold:
                self.backup(k)

    # -- the API
    def admit(self, tokens: list[int], ns: str | None, reserve: int) -> tuple[int, int] | None:
        path, partial, pp, g, h = self.lookup(tokens, ns)
        need = h // self.page + -(-reserve // self.page)
        pinned = sum(self.pages(k) for k in path if self.segs[k].gpu and not self.segs[k].lock)
        if partial is not None and self.segs[partial].gpu and not self.segs[partial].lock:
            pinned += pp
        if need > self.free() + self.evictable() - pinned:
            return None
        if partial is not None:
            path.append(self.split(partial, pp))
        deepest = path[-1] if path else None
        self.lock(deepest, 1)
        for k in path:
            self.touch(k)
        self.evict_gpu(need)
        for k in path:
            self.segs[k].gpu = True
        self.reserved += -(-reserve // self.page)
        self.active.append(RefAdmission(deepest, -(-reserve // self.page), reserve))
        return g, h

    def insert_unfinished(self, adm: RefAdmission, done: list[int], ns: str | None, chunked: bool) -> int:
        """The prefix computed so far goes into the tree; the request now holds it and reserves less."""
        if not adm.live:
            return 0
        held = len(adm.node[1]) if adm.node is not None else 0
        length = len(done) // self.page * self.page
        if length <= held:
            return held
        left = max(0, adm.tokens - (length - held))
        moved = -(-adm.tokens // self.page) - -(-left // self.page)
        adm.tokens, adm.reserved, self.reserved = left, adm.reserved - moved, self.reserved - moved
        deepest = self.insert(done[:length], ns, chunked)
        if deepest is not None and len(deepest[1]) > held:
            self.lock(deepest, 1)
            self.lock(adm.node, -1)
            adm.node = deepest
        return len(adm.node[1]) if adm.node is not None else 0

    def release(self, adm: RefAdmission) -> bool:
        if not adm.live:
            return False
        adm.live = False
        self.active.remove(adm)
        self.reserved -= adm.reserved
        return True

    def insert(self, tokens: list[int], ns: str | None, chunked: bool = False) -> Key | None:
        """Returns the deepest node reached (None: nothing placed)."""
        key = tuple(tokens[: len(tokens) // self.page * self.page])
        path, partial, pp = self.walk(ns, key)
        if partial is not None:
            path.append(self.split(partial, pp))
        top = path[-1] if path else None
        self.lock(top, 1)
        want = (
            sum(self.pages(k) for k in path if not self.segs[k].gpu)
            + (len(key) - (len(top[1]) if top else 0)) // self.page
        )
        self.evict_gpu(want)
        budget = min(want, self.free())
        end, last = 0, None
        for k in path:
            if not self.segs[k].gpu:
                if budget < self.pages(k):
                    self.lock(top, -1)
                    return last
                budget -= self.pages(k)
                self.segs[k].gpu = True
            self.touch(k)
            self.hit(k, chunked)
            end, last = len(k[1]), k
        if budget:
            last = (ns, key[: end + budget * self.page])
            self.segs[last] = Seg(end)
            self.touch(last)
            self.hit(last, chunked)
        self.lock(top, -1)
        return last


class CacheMachine(RuleBasedStateMachine):
    admissions = Bundle("admissions")

    @initialize(
        page=st.sampled_from([1, 2]),
        mode=st.sampled_from(["off", "write_back", "write_through", "write_through_selective"]),
        gpu=st.integers(8, 16),
        threshold=st.sampled_from([1, 3]),
    )
    def setup(self, page: int, mode: str, gpu: int, threshold: int) -> None:
        hicache = mode != "off"
        policy = mode if hicache else "write_through"
        host = 2 * gpu
        self.cache = RadixCache(
            CacheConfig(
                gpu_tokens=gpu,
                page_size=page,
                hicache=hicache,
                host_tokens=host,
                write_policy=policy,
                load_back_threshold=threshold,
            )
        )
        self.ref = Reference(gpu, host, page, hicache, policy, threshold)
        self.seen: dict[tuple[str | None, tuple[int, ...]], tuple[int, ...]] = {}
        self.last_matched: tuple[str | None, tuple[int, ...]] | None = None
        self.pairs: dict[int, RefAdmission] = {}

    @rule(
        target=admissions,
        tokens=st.lists(st.integers(0, 2), min_size=1, max_size=10),
        ns=st.sampled_from([None, None, "t"]),
        out=st.integers(0, 4),
    )
    def admit(
        self, tokens: list[int], ns: str | None, out: int
    ) -> tuple[Admission | None, list[int], str | None]:
        prompt = self.prompt(ns, tokens)  # a tuple, as the engine passes it: admit reuses match's lookup
        self.last_matched = (ns, prompt)
        m = self.cache.match(prompt, ns)
        reserve = len(tokens) - m.total + out
        adm = self.cache.admit(prompt, ns, reserve)
        ref = self.ref.admit(tokens, ns, reserve)
        assert (adm is None) == (ref is None)
        if adm is not None and ref is not None:
            assert (adm.gpu_hit_tokens, adm.host_loaded_tokens) == ref
            assert adm.cached_tokens <= len(tokens) - 1
            self.pairs[id(adm)] = self.ref.active[-1]
        return adm, tokens, ns

    @rule(item=consumes(admissions), output=st.lists(st.integers(0, 2), max_size=4))
    def finish(self, item: tuple[Admission | None, list[int], str | None], output: list[int]) -> None:
        adm, tokens, ns = item
        if adm is None:
            return
        full = tokens + output
        self.cache.finish(adm, full, ns)
        ref = self.pairs.pop(id(adm))
        if self.ref.release(ref):
            self.ref.insert(full, ns)
            self.ref.lock(ref.node, -1)
        self.prompt(ns, full)

    @rule(item=consumes(admissions))
    def abort(self, item: tuple[Admission | None, list[int], str | None]) -> None:
        adm = item[0]
        if adm is not None:
            self.cache.abort(adm)
            ref = self.pairs.pop(id(adm))
            if self.ref.release(ref):
                self.ref.lock(ref.node, -1)

    @rule(item=admissions, done=st.integers(0, 10), chunked=st.booleans())
    def insert_unfinished(
        self, item: tuple[Admission | None, list[int], str | None], done: int, chunked: bool
    ) -> None:
        """A running request inserts the first ``done`` tokens of its prompt (cache_unfinished_req)."""
        adm, tokens, ns = item
        if adm is None or id(adm) not in self.pairs:
            return
        prefix = self.prompt(ns, tokens[:done])
        ref = self.pairs[id(adm)]
        held = self.cache.insert_unfinished(adm, prefix, ns, chunked)
        assert held == self.ref.insert_unfinished(ref, list(prefix), ns, chunked)
        assert not ref.live or held == adm.lock.node.depth  # a live request holds what it inserted

    @rule(item=admissions, more=st.integers(1, 6))
    def extend(self, item: tuple[Admission | None, list[int], str | None], more: int) -> None:
        adm = item[0]
        if adm is None or id(adm) not in self.pairs or not self.pairs[id(adm)].live:
            return
        ref = self.pairs[id(adm)]
        pages = -(-(adm.lock.reserved_tokens + more) // self.ref.page) - -(
            -adm.lock.reserved_tokens // self.ref.page
        )
        ok = pages <= self.ref.free() + self.ref.evictable()
        if ok:
            self.ref.evict_gpu(pages)
            self.ref.reserved += pages
            ref.reserved += pages
            ref.tokens += more
        assert self.cache.extend(adm, more) == ok

    @rule()
    def flush(self) -> None:
        expected = not self.ref.active
        assert self.cache.flush() == expected
        if expected:
            self.ref.segs.clear()

    @rule()
    def restart(self) -> None:
        self.cache.restart()
        self.ref.segs.clear()
        self.ref.reserved = 0
        for adm in list(self.ref.active):
            adm.live = False
        self.ref.active.clear()

    def prompt(self, ns: str | None, tokens: list[int]) -> tuple[int, ...]:
        """The one tuple object used for these tokens (the cache memoises its last lookup by identity)."""
        t = tuple(tokens)
        return self.seen.setdefault((ns, t), t)

    @invariant()
    def pools_agree_and_fit(self) -> None:
        if not hasattr(self, "cache"):
            return
        s, ref, p = self.cache.stats(), self.ref, self.ref.page
        assert s.gpu_used <= s.gpu_capacity and s.host_used <= s.host_capacity
        assert (s.gpu_cached, s.host_used) == (ref.gpu_used() * p, ref.host_used() * p)
        assert s.gpu_used == (ref.gpu_used() + ref.reserved) * p
        assert s.gpu_evictable == ref.evictable() * p
        # The same tuple objects every time, the last one matched first: the cache memoises its last
        # lookup of a tuple, so a memo that outlived a mutation by the rule just run shows up here.
        for ns, tokens in sorted(self.seen, key=lambda seen: seen != self.last_matched):
            m = self.cache.match(tokens, ns)
            _, _, _, g, h = ref.lookup(list(tokens), ns)
            assert (m.gpu_tokens, m.host_tokens, m.storage_tokens) == (g, h, 0)
            self.last_matched = (ns, tokens)

    @invariant()
    def tree_is_closed_and_bookkeeping_is_exact(self) -> None:
        if not hasattr(self, "cache"):
            return
        c = self.cache
        nodes: list[Node] = []
        for root in c.tree.roots.values():
            stack = list(root.children.values())
            while stack:
                n = stack.pop()
                nodes.append(n)
                stack.extend(n.children.values())
        for n in nodes:
            assert n.parent is not None and (n.gpu or n.host)
            assert n.parent.parent is None or n.parent.gpu or not n.gpu  # GPU residency is tree-closed
            assert n.gpu_children == sum(ch.gpu for ch in n.children.values())
            assert (n in c.tree.gpu_lru) == (n.gpu and not n.lock_ref and n.gpu_children == 0)
            assert (n in c.tree.host_lru) == (n.host and not n.gpu and not n.lock_ref and not n.children)
            locked_below = any(ch.lock_ref for ch in n.children.values())
            assert not locked_below or n.lock_ref  # locks cover whole paths
        assert c.tree.evictable == sum(len(n.key) // c.page for n in nodes if n.gpu and not n.lock_ref)
        assert len(c.tree.gpu_lru) + len(c.tree.host_lru) <= len(nodes)


CacheMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=30, deadline=None)
TestCacheMachine = CacheMachine.TestCase


_ops = st.lists(
    st.tuples(
        st.sampled_from(["serve", "hold", "prefill", "release", "flush", "restart"]),
        st.integers(0, 5),
        st.integers(1, 40),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    policy=st.sampled_from(["write_back", "write_through", "write_through_selective"]),
    extra_buffer=st.booleans(),
    slots=st.integers(1, 4),
)
def test_hybrid_anchor_pools_stay_consistent(
    ops: list[tuple[str, int, int]], policy: str, extra_buffer: bool, slots: int
) -> None:
    """Random traffic on a hybrid cache (with running requests inserting their prefixes): anchor counts
    match the tree, pools never overflow, pins match running requests, and every reported match ends at
    an anchored node."""
    c = RadixCache(
        CacheConfig(
            gpu_tokens=48,
            page_size=2,
            hicache=True,
            host_tokens=96,
            write_policy=policy,
            hybrid=True,
            mamba_slots=slots,
            host_mamba_slots=2 * slots,
            mamba_extra_buffer=extra_buffer,
            mamba_track_interval=8,
            load_back_threshold=1,
        )
    )
    held: list[tuple[Admission, list[int]]] = []
    for op, doc, n in ops:
        tokens = [doc * 100 + i % 3 for i in range(n)]
        if op in ("serve", "hold"):
            adm = c.admit(tokens, None, n + 4)
            if adm is not None and op == "serve":
                c.finish(adm, [*tokens, 1, 2, 3, 4], None)
            elif adm is not None:
                held.append((adm, tokens))
        elif op == "prefill" and held:  # a running request inserts what it has computed so far
            adm, prompt = held[doc % len(held)]
            c.insert_unfinished(adm, prompt[:n], None, chunked=n % 2 == 0)
        elif op == "release" and held:
            c.finish(held.pop(0)[0], tokens, None)
        elif op == "flush":
            assert c.flush() == (not held)
        elif op == "restart":
            c.restart()
            held.clear()
        _check_anchors(c, len(held))


def _check_anchors(c: RadixCache, running: int) -> None:
    nodes = [n for _, _, n in c.tree.nodes()]
    a, s = c.anchors, c.stats()
    assert a.cached == sum(n.mamba_gpu for n in nodes) and a.host_used == sum(n.mamba_host for n in nodes)
    assert a.running == running and s.mamba_used <= a.slots and s.mamba_host_used <= a.host_slots
    pins = sum(n.mamba_lock for n in nodes) + sum(r.mamba_lock for r in c.tree.roots.values())
    assert pins == running  # each running request pins exactly one node (moved by its inserts)
    assert all(n.gpu for n in nodes if n.mamba_gpu)
    assert s.gpu_used <= s.gpu_capacity and s.host_used <= s.host_capacity
    for n in nodes:
        tokens: list[int] = []
        x: Node | None = n
        while x is not None and x.parent is not None:
            tokens[:0] = x.key
            x = x.parent
        m = c.match([*tokens, 0])
        usable = {y.depth for y in nodes if y.mamba_gpu or y.mamba_host}
        assert m.total == 0 or m.total in usable
