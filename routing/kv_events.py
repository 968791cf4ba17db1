"""The typed KV events of a replica (sglang-contract.md §6), as routing takes them: pure values.

``proxy/sync/kv_wire.py`` decodes ZMQ frames into these (and re-exports them); ``routing.kv_index`` and the
cache model's exact mode consume them, so routing never imports the proxy.

- ``BlockStored``: pages ``block_hashes`` (engine hashes, one per page of ``block_size`` tokens, whose
  ids are ``token_ids`` concatenated) now held on ``medium``; ``parent_block_hash`` is the engine hash
  of the page before the first one (None at a root). 0.5.23 maps add ``cache_salt`` (the namespace).
- ``BlockRemoved``: pages no longer on ``medium`` (0.5.10: gone from GPU *and* host, labelled GPU).
- ``AllBlocksCleared``: the cache was flushed (or the engine restarted).
- ``EventBatch``: one published batch; ``encoding`` is "array" (0.5.10), "map" (0.5.23) or "empty".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

MEDIA = ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")


# The events are NamedTuples: one is built per engine page (SGLang publishes a BlockStored per page), and
# building a frozen dataclass of nine fields cost more than decoding the page's msgpack map.
class BlockStored(NamedTuple):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(NamedTuple):
    block_hashes: tuple[int, ...]
    medium: str | None = None


class AllBlocksCleared(NamedTuple):
    medium: str | None = None


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: its sequence number, topic, publish time (s), events and DP rank."""

    seq: int
    topic: bytes
    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None
    encoding: str  # "array" (0.5.10), "map" (0.5.23), or "empty" (no events to tell)
