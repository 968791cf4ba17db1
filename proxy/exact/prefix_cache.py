"""A bounded LRU cache of the token ids of rendered conversation prefixes.

Why it is exact: a tokenizer splits its special tokens (``<|im_end|>``, ...) out of the text before
normalizing and pre-tokenizing it, so no BPE merge crosses one. Cut the text right after a special token
and ``ids(text) == ids(text[:cut]) + ids(text[cut:])``. A chat template ends every turn with such a token,
so the ids of a conversation up to the end of turn k are a prefix of the ids of the conversation one turn
later (``tests/proxy/exact/test_tokenizer.py`` checks the property against the real tokenizer).

Keys: ``xxh3_128`` of the text prefix up to a cut, with the prefix length. Every cut of a text is hashed
in one streaming pass (``cut_keys``), so finding the longest cached prefix costs O(len(text)) hashing
plus one dict lookup per cut. A 128-bit hash of the very text the new request starts with is what makes
reuse safe: a cached prefix is used only when the new text really starts with it (up to a 2^-128
collision). No text is kept; ids are stored as ``array('I')`` (4 bytes each).

Bounds: at most ``max_entries`` entries and ``max_ids`` ids in all (least recently used evicted first);
a prefix longer than ``max_ids // 4`` ids is not stored.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import xxhash

Key = tuple[int, int]  # (xxh3_128 of the prefix, its length in characters)
K = TypeVar("K")


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    evicted: int = 0

    def hit_ratio(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0


def cut_keys(text: str, cuts: Sequence[int]) -> Iterator[Key]:
    """The key of ``text[:c]`` for every cut ``c`` (ascending), in one streaming hash pass."""
    h = xxhash.xxh3_128()
    start = 0
    for c in cuts:
        h.update(text[start:c].encode("utf-8", "surrogatepass"))
        start = c
        yield h.intdigest(), c


class IdsLru(Generic[K]):
    """A bounded LRU of token-id arrays by key: at most ``max_entries`` entries and ``max_ids`` ids in all
    (least recently used evicted first); an array of more than ``max_ids // 4`` ids is not kept. Shared by
    this prefix cache and ``proxy/exact/paragraph_cache.py``; each counts its own hits and misses in
    ``stats``."""

    def __init__(self, max_entries: int, max_ids: int) -> None:
        self.max_entries, self.max_ids = max_entries, max_ids
        self._entries: OrderedDict[K, array[int]] = OrderedDict()
        self.total_ids = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> array[int] | None:
        """The ids under ``key``, marked recently used, or None."""
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids

    def put(self, key: K, ids: array[int]) -> None:
        """Keeps ``ids`` under ``key`` (not when already there, or too long to keep)."""
        if len(ids) > self.max_ids // 4 or key in self._entries:
            return
        self._entries[key] = ids
        self.total_ids += len(ids)
        self.stats.stored += 1
        while len(self._entries) > self.max_entries or self.total_ids > self.max_ids:
            _, old = self._entries.popitem(last=False)
            self.total_ids -= len(old)
            self.stats.evicted += 1

    def status(self) -> dict[str, float]:
        s = self.stats
        return {
            "entries": len(self), "ids": self.total_ids, "hits": s.hits, "misses": s.misses,
            "hit_ratio": s.hit_ratio(), "evicted": s.evicted,
        }  # fmt: skip


class PrefixCache(IdsLru[Key]):
    """See the module docstring."""

    def __init__(self, max_entries: int = 4096, max_ids: int = 8 << 20) -> None:
        super().__init__(max_entries, max_ids)

    def longest(self, keys: Sequence[Key]) -> tuple[Key, array[int]] | None:
        """The longest cached prefix among ``keys`` (ascending by length), marked recently used."""
        for key in reversed(keys):
            ids = self.get(key)
            if ids is not None:
                self.stats.hits += 1
                return key, ids
        self.stats.misses += 1
        return None
