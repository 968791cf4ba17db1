"""One replica's map from the engine's page hashes to our exact-mode block keys (pure).

A replica's ``BlockStored`` events name pages of ``P`` tokens by the engine's own hashes (its hash seed
need not match ours). Our keys (``routing.hashing.token_block_hashes``) cover blocks of ``B`` =
``token_block`` tokens, so ``P`` must divide ``B`` (else the replica cannot be exact: ``why`` says so).
Each page remembers its chain state, ``(key, tail, depth)``: our key of the last full block up to and
including it (the namespace's ``chain_seed`` before the first), the token ids after that block (as
``token_bytes``, 4 bytes per id), and the number of full blocks. A page's state follows from its
parent's:

    tail' = parent.tail ‖ u32le(page ids);   if |tail'| = 4B:  key' = xxh3_64(tail', seed=parent.key),
                                                              tail' = b"", depth' = depth + 1

so a page whose parent is known maps without its whole prefix, and a chain split over many events maps
to the same keys as ``token_block_hashes`` of the whole. The page at which a block completes *names*
that block (``block``): storing it puts our key on a tier, removing it takes the key off. A page whose
parent is unknown (stored before a reset, or dropped by the memory bound) is an orphan and is skipped.

Namespaces: 0.5.23 events carry ``cache_salt``; our salt is ``namespace_salt(Namespace(cache_salt=s))``
(tenants force ``cache_salt``, so it matches what the gateway keys). 0.5.10 events carry none and
SGLang 0.5.10 does not hash the salt either, so their pages key into the empty namespace: salted
traffic on 0.5.10 replicas is never confirmed by events and stays learned (``RoutingRequest.exact_keys``
with a tenant). Pages with a LoRA id are skipped (our keys do not name adapters by id).

Media: a page may be held on several (0.5.23: ``GPU`` and ``CPU_PINNED``, a bit each); it is forgotten
when the last one removes it. A page costs ~250-300 bytes (its ``Page`` with a tail of up to 4B - 4
bytes, and its dict entries). Memory is bounded: at most ``capacity_pages`` pages (the replica's GPU +
host capacity in pages), the least recently stored dropped first (their keys are no longer event-backed
and fall back to the learned model).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import xxhash

from routing.canonical import namespace_salt
from routing.hashing import chain_seed, token_bytes
from routing.kv_events import BlockStored
from routing.prompt import Namespace
from routing.types import BlockHash

MIN_CAPACITY_PAGES = 1024
_MEDIA_BITS = {"GPU": 1, "CPU_PINNED": 2, "DISK": 4}
_OTHER_MEDIUM = 8
_xxh3 = xxhash.xxh3_64_intdigest


def medium_bits(medium: str | None) -> int:
    """The bit of a medium (None: every medium)."""
    return -1 if medium is None else _MEDIA_BITS.get(medium, _OTHER_MEDIUM)


class Page:
    """One engine page's chain state (see the module docstring)."""

    __slots__ = ("block", "depth", "key", "media", "tail")

    def __init__(self, key: int, tail: bytes, depth: int, block: BlockHash | None) -> None:
        self.key = key  # our key of the last full block up to this page (the chain seed before the first)
        self.tail = tail  # u32le ids since that block
        self.depth = depth  # full blocks up to this page
        self.block = block  # our key of the block this page completes, if it completes one
        self.media = 0  # bits of the media holding it


@dataclass(slots=True)
class IndexStats:
    pages_stored: int = 0
    orphans: int = 0  # pages whose parent was unknown
    skipped: int = 0  # pages not mappable (LoRA, a page size that does not divide token_block)
    dropped: int = 0  # pages forgotten by the memory bound


class KvIndex:
    """Engine page hash -> chain state and our key (see the module docstring)."""

    def __init__(self, model: str, token_block: int, max_blocks: int, capacity_pages: int) -> None:
        self.model = model
        self.token_block = token_block
        self.max_blocks = max_blocks
        self.capacity_pages = max(MIN_CAPACITY_PAGES, capacity_pages)
        self.why = ""  # non-empty: this replica's pages cannot be mapped exactly
        self.stats = IndexStats()
        self._pages: dict[int, Page] = {}
        self._keys: dict[BlockHash, int] = {}  # our key -> the engine page that names it
        self._seeds: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is event-backed (named by a page the events say is held)."""
        return key in self._keys

    def clear(self) -> None:
        self._pages.clear()
        self._keys.clear()

    def stored(self, ev: BlockStored) -> list[BlockHash]:
        """Maps the event's pages; returns our keys of the blocks they complete, in chain order."""
        size = ev.block_size
        if size <= 0 or self.token_block % size or ev.lora_id is not None:
            self._refuse(ev, size)
            return []
        parent = self._parent(ev)
        keys: list[BlockHash] = []
        medium, pages = medium_bits(ev.medium or "GPU"), self._pages
        for i, h in enumerate(ev.block_hashes):
            page = pages.pop(h, None)
            if page is None:
                if parent is None:  # an orphan: its parent is unknown
                    self.stats.orphans += len(ev.block_hashes) - i
                    break
                page = self._child(parent, ev.token_ids[i * size : (i + 1) * size])
            page.media |= medium
            pages[h] = page
            if page.block is not None:
                self._keys[page.block] = h
                keys.append(page.block)
            parent = page
        self.stats.pages_stored += len(ev.block_hashes)
        self._bound()
        return keys

    def removed(self, hashes: tuple[int, ...], medium: str | None) -> list[BlockHash]:
        """The pages left ``medium`` (None: every medium); returns our keys of the blocks they named."""
        keys: list[BlockHash] = []
        pages = self._pages
        for h in hashes:
            page = pages.get(h)
            if page is None:
                continue
            page.media &= ~medium_bits(medium)
            if page.block is not None:
                keys.append(page.block)
            if not page.media:
                self._forget(h, page)
        return keys

    def _parent(self, ev: BlockStored) -> Page | None:
        if ev.parent_block_hash is None:
            salt = "" if ev.cache_salt is None else namespace_salt(Namespace(cache_salt=ev.cache_salt))
            return Page(self._seed(salt), b"", 0, None)
        return self._pages.get(ev.parent_block_hash)

    def _child(self, parent: Page, ids: tuple[int, ...]) -> Page:
        """The chain state after ``parent`` and one page of ``ids`` (the formula above)."""
        tail = parent.tail + token_bytes(ids)
        if len(tail) < 4 * self.token_block:
            return Page(parent.key, tail, parent.depth, None)
        if parent.depth >= self.max_blocks:  # beyond what requests key: state only
            return Page(parent.key, b"", parent.depth + 1, None)
        key = _xxh3(tail, parent.key)
        return Page(key, b"", parent.depth + 1, key)

    def _seed(self, salt: str) -> int:
        seed = self._seeds.get(salt)
        if seed is None:
            seed = self._seeds[salt] = chain_seed(self.model, salt)
        return seed

    def _forget(self, h: int, page: Page) -> None:
        del self._pages[h]
        if page.block is not None and self._keys.get(page.block) == h:
            del self._keys[page.block]

    def _bound(self) -> None:
        """Over capacity: drop the oldest pages, the excess and a 64th of the capacity at once (so the
        scan over the dict's deleted front slots stays amortized O(1) per page, as in routing.tiers)."""
        excess = len(self._pages) - self.capacity_pages
        if excess <= 0:
            return
        oldest = list(islice(self._pages.items(), excess + self.capacity_pages // 64))
        for h, page in oldest:
            self._forget(h, page)
        self.stats.dropped += len(oldest)

    def _refuse(self, ev: BlockStored, size: int) -> None:
        self.stats.skipped += len(ev.block_hashes)
        if ev.lora_id is None and not self.why:
            self.why = f"engine page size {size} does not divide token_block {self.token_block}"
