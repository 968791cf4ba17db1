"""The emulated L3 ("storage") KV tier: a set of pages keyed by a chained page hash, LRU beyond capacity.

How SGLang's HiCache storage backends key pages (``hicache_storage.py`` ``get_hash_str``): the hash of page
``i`` is SHA-256 over the hash of page ``i - 1`` and the page's token ids, so one key names a whole
prefix and two prompts share storage pages exactly as long as they share whole pages. Here the
``extra_key`` is mixed in as well (as SGLang 0.5.23 does), so tenants never share storage pages.

Only the *presence* of pages is modelled (no KV bytes). Two implementations:

- ``Storage``: in memory; a process restart loses it (useful for tests).
- ``FileStorage(directory, capacity_tokens)``: the same, plus an append-only log ``pages.log`` in
  ``directory`` (``+<hex> <tokens>`` when a page is written, ``-<hex>`` when it is evicted). A new
  instance on the same directory replays the log, so the tier survives an emulator restart, like
  SGLang's ``file`` backend. The log is compacted (rewritten atomically via a temporary file and
  ``os.replace``) when it holds more than four times as many lines as live pages.

LRU order is the order pages were written or read (``touch``); after a replay it is the write order.
"""

from __future__ import annotations

import hashlib
import os
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

PageHash = bytes
"""16 bytes: the first half of a SHA-256 digest (see ``chain_hash``)."""

ROOT_HASH: PageHash = b""
"""The "parent hash" of a first page."""


def chain_hash(parent: PageHash, page: Sequence[int], extra_key: str | None) -> PageHash:
    """SHA-256(parent ‖ token ids as 4-byte little-endian ‖ extra_key), truncated to 16 bytes."""
    return hashlib.sha256(parent + token_bytes(page) + _suffix(extra_key)).digest()[:16]


def chain_hashes(
    parent: PageHash, tokens: Sequence[int], page_size: int, extra_key: str | None
) -> Iterator[PageHash]:
    """Lazily yield the chained hashes of the whole pages of ``tokens`` following ``parent``.

    Tokens are packed to bytes a batch of pages at a time (so a caller that stops at the first page
    missing from storage pays for about one batch), then each page is one SHA-256 over a byte slice.
    """
    suffix, sha256 = _suffix(extra_key), hashlib.sha256
    width = 4 * page_size
    batch = max(1, _BATCH_TOKENS // page_size) * page_size
    whole = len(tokens) // page_size * page_size
    for start in range(0, whole, batch):
        data = token_bytes(tokens[start : min(start + batch, whole)])
        for i in range(0, len(data), width):
            parent = sha256(parent + data[i : i + width] + suffix).digest()[:16]
            yield parent


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as 4-byte little-endian words (each taken modulo 2**32)."""
    try:
        words = array("I", tokens)
    except (OverflowError, TypeError):
        words = array("I", [t & 0xFFFFFFFF for t in tokens])
    if words.itemsize != 4:  # pragma: no cover - platforms whose C unsigned int is not 32 bits
        return b"".join((t & 0xFFFFFFFF).to_bytes(4, "little") for t in tokens)
    if sys.byteorder == "big":  # pragma: no cover
        words.byteswap()
    return words.tobytes()


def _suffix(extra_key: str | None) -> bytes:
    return b"" if extra_key is None else b"\x00" + extra_key.encode("utf-8", "surrogatepass")


_BATCH_TOKENS = 4096
"""Tokens packed per batch in ``chain_hashes``."""


class Storage:
    """In-memory L3 tier: page hash -> tokens in that page, in LRU order (oldest first)."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError("storage capacity_tokens must be >= 0")
        self.capacity_tokens = capacity_tokens
        self._pages: OrderedDict[PageHash, int] = OrderedDict()
        self._used = 0
        self.evicted_tokens_total = 0
        self.version = 0  # bumped whenever the set of pages may have changed

    @property
    def used_tokens(self) -> int:
        return self._used

    def __contains__(self, page: PageHash) -> bool:
        return page in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def longest_prefix(self, hashes: Iterable[PageHash]) -> int:
        """How many leading hashes are stored (consumes ``hashes`` lazily, stops at the first miss)."""
        n = 0
        for h in hashes:
            if h not in self._pages:
                break
            n += 1
        return n

    def touch(self, hashes: Iterable[PageHash]) -> None:
        """Mark pages as just read (most recently used)."""
        for h in hashes:
            if h in self._pages:
                self._pages.move_to_end(h)

    def put(self, hashes: Iterable[PageHash], page_tokens: int) -> int:
        """Store pages of ``page_tokens`` tokens each, evict LRU pages beyond capacity; returns #new pages."""
        pages, fits = self._pages, page_tokens <= self.capacity_tokens
        new = list(hashes)
        if fits and pages.keys().isdisjoint(new) and len(set(new)) == len(new):
            pages.update(dict.fromkeys(new, page_tokens))  # all new (the usual backup): in bulk
            added = new
        else:
            added = []
            for h in new:
                if h in pages:
                    pages.move_to_end(h)
                elif fits:
                    pages[h] = page_tokens
                    added.append(h)
        self._used += len(added) * page_tokens
        self.version += 1
        evicted = self._evict()
        self._record(added, evicted)
        return len(added)

    def clear(self) -> None:
        self._pages.clear()
        self._used = 0
        self.version += 1
        self._record_clear()

    def _evict(self) -> list[PageHash]:
        evicted: list[PageHash] = []
        while self._used > self.capacity_tokens and self._pages:
            h, tokens = self._pages.popitem(last=False)
            self._used -= tokens
            self.evicted_tokens_total += tokens
            evicted.append(h)
        return evicted

    def _record(self, added: Sequence[PageHash], evicted: Sequence[PageHash]) -> None:
        """Persistence hook (nothing to do in memory)."""

    def _record_clear(self) -> None:
        """Persistence hook (nothing to do in memory)."""


def _log_lines(sign: str, hashes: Sequence[PageHash], tail: str) -> str:
    """One log line ``{sign}{hex}{tail}`` per hash. Hashes of one length (16 bytes: all the cache makes)
    are hex-encoded in one call that puts a newline between hashes, which then becomes the line break."""
    if not hashes:
        return ""
    width = len(hashes[0])
    if width and set(map(len, hashes)) == {width}:
        text = b"".join(hashes).hex("\n", width).replace("\n", f"{tail}\n{sign}")
        return f"{sign}{text}{tail}\n"
    return "".join(f"{sign}{h.hex()}{tail}\n" for h in hashes)


class FileStorage(Storage):
    """A ``Storage`` whose page set is persisted in ``directory/pages.log`` and replayed on start."""

    LOG_NAME = "pages.log"

    def __init__(self, directory: Path, capacity_tokens: int) -> None:
        super().__init__(capacity_tokens)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log_path = self.directory / self.LOG_NAME
        self._log_lines = 0
        self._replay()
        self._evict()
        self._compact()

    def _replay(self) -> None:
        if not self._log_path.exists():
            return
        with self._log_path.open("r", encoding="ascii") as f:
            for line in f:
                self._apply(line.strip())

    def _apply(self, line: str) -> None:
        try:
            if line.startswith("+"):
                hex_hash, tokens = line[1:].split(" ")
                h, n = bytes.fromhex(hex_hash), int(tokens)
                if h not in self._pages:
                    self._pages[h] = n
                    self._used += n
            elif line.startswith("-"):
                n_old = self._pages.pop(bytes.fromhex(line[1:]), None)
                self._used -= n_old or 0
        except ValueError:
            return  # a torn last line after a crash: ignore it

    def _record(self, added: Sequence[PageHash], evicted: Sequence[PageHash]) -> None:
        if not added and not evicted:
            return
        pages = self._pages
        kept = [h for h in added if h in pages] if evicted else added
        tail = f" {pages[kept[0]]}" if kept else ""  # every page of one put has the same size
        text = _log_lines("+", kept, tail) + _log_lines("-", evicted, "")
        with self._log_path.open("a", encoding="ascii") as f:
            f.write(text)
        self._log_lines += len(kept) + len(evicted)
        if self._log_lines > 4 * len(self._pages) + 1024:
            self._compact()

    def _record_clear(self) -> None:
        self._compact()

    def _compact(self) -> None:
        tmp = self._log_path.with_suffix(".tmp")
        with tmp.open("w", encoding="ascii") as f:
            f.writelines(f"+{h.hex()} {n}\n" for h, n in self._pages.items())
        os.replace(tmp, self._log_path)
        self._log_lines = len(self._pages)
