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
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

PageHash = bytes
"""16 bytes: the first half of a SHA-256 digest (see ``chain_hash``)."""

ROOT_HASH: PageHash = b""
"""The "parent hash" of a first page."""


def chain_hash(parent: PageHash, page: Sequence[int], extra_key: str | None) -> PageHash:
    """SHA-256(parent ‖ token ids as 4-byte little-endian ‖ extra_key), truncated to 16 bytes."""
    h = hashlib.sha256(parent)
    h.update(b"".join((t & 0xFFFFFFFF).to_bytes(4, "little") for t in page))
    if extra_key is not None:
        h.update(b"\x00" + extra_key.encode("utf-8", "surrogatepass"))
    return h.digest()[:16]


def chain_hashes(
    parent: PageHash, tokens: Sequence[int], page_size: int, extra_key: str | None
) -> Iterator[PageHash]:
    """Lazily yield the chained hashes of the whole pages of ``tokens`` following ``parent``."""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        parent = chain_hash(parent, tokens[start : start + page_size], extra_key)
        yield parent


class Storage:
    """In-memory L3 tier: page hash -> tokens in that page, in LRU order (oldest first)."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError("storage capacity_tokens must be >= 0")
        self.capacity_tokens = capacity_tokens
        self._pages: OrderedDict[PageHash, int] = OrderedDict()
        self._used = 0
        self.evicted_tokens_total = 0

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
        added: list[PageHash] = []
        for h in hashes:
            if h in self._pages:
                self._pages.move_to_end(h)
            elif page_tokens <= self.capacity_tokens:
                self._pages[h] = page_tokens
                self._used += page_tokens
                added.append(h)
        evicted = self._evict()
        self._record(added, evicted)
        return len(added)

    def clear(self) -> None:
        self._pages.clear()
        self._used = 0
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
        lines = [f"+{h.hex()} {self._pages.get(h, 0)}\n" for h in added if h in self._pages]
        lines += [f"-{h.hex()}\n" for h in evicted]
        with self._log_path.open("a", encoding="ascii") as f:
            f.writelines(lines)
        self._log_lines += len(lines)
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
