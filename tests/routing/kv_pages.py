"""Helpers for exact-mode tests: a token chain cut into engine pages, as BlockStored events.

Engine page hashes here are arbitrary integers (``base + page index``): exact mode never needs the
engine's hash seed, only the parent links and the token ids the events carry.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.kv_events import BlockRemoved, BlockStored, EventBatch, KvEvent

PAGE = 16


def ids(n: int, start: int = 0) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def stored(
    tokens: Sequence[int],
    base: int,
    groups: Sequence[int] = (),
    *,
    page: int = PAGE,
    parent: int | None = None,
    medium: str = "GPU",
    salt: str | None = None,
) -> list[BlockStored]:
    """The chain ``tokens`` (whole pages) as events of ``groups`` pages each (default: one event);
    page i has engine hash ``base + i`` and its parent is page i - 1 (``parent`` before the first)."""
    n = len(tokens) // page
    groups = list(groups) or [n]
    assert sum(groups) == n
    out, first = [], 0
    for g in groups:
        hashes = tuple(base + i for i in range(first, first + g))
        prev = parent if first == 0 else base + first - 1
        toks = tuple(tokens[first * page : (first + g) * page])
        out.append(BlockStored(hashes, prev, toks, page, medium=medium, cache_salt=salt))
        first += g
    return out


def removed(base: int, first: int, count: int, medium: str = "GPU") -> BlockRemoved:
    return BlockRemoved(tuple(base + i for i in range(first, first + count)), medium)


def batch(events: Sequence[KvEvent], encoding: str = "map", seq: int = 0, ts: float = 1.0) -> EventBatch:
    return EventBatch(seq, b"", ts, tuple(events), 0, encoding)
