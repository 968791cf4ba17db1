"""The KV events of one replica's radix tree, as SGLang queues them (``kv_event_queue``), in wire shape.

``KvRecorder`` is the tree's ``TreeEvents``: ``emulator/radix_tree.py`` calls it where a node goes onto
or off a tier, and it appends the events SGLang would queue there (sglang-contract.md §6), already in
the msgpack-ready shape of the chosen encoding; ``take()`` hands them to the publisher
(``emulator/kv_events.py``). Nothing here does I/O.

Block identity (both encodings): one ``BlockStored`` per page of a node the first time it is on GPU,
``block_size`` = the page's tokens, ``block_hash = int64(SHA-256(prior digest ‖ token ids as 4-byte
little-endian)[:8])`` read big-endian and signed, chained over the *full* 32-byte digest of the previous
page (the parent node's last page for a node's first page; no prior at a root), ``parent_block_hash``
the previous page's block hash or nil under a root. The digests live on the node (``ev_hashes``) and are
cut with it when a node splits, so a node's pages keep their identity.

What fires, per encoding (``FORMATS``):

- ``0.5.10`` (positional arrays, ``medium`` always "GPU"): stored when a node first reaches GPU; removed
  when it leaves the tree (deleted from GPU, or freed from host: still labelled "GPU"); demotion to host,
  a host backup and a load-back emit nothing (the block stays "stored" while any tier holds it).
- ``0.5.23`` (tagged maps): ``BlockStored GPU`` when a node reaches GPU (its first insert, a load-back,
  a storage prefetch: the emulated one lands on GPU directly, so no ``CPU_PINNED`` store precedes it
  as in SGLang), ``BlockStored CPU_PINNED`` when a backup lands on host, ``BlockRemoved GPU`` when it
  leaves GPU (eviction or demotion), ``BlockRemoved CPU_PINNED`` when its host copy is freed. A node in a
  cache namespace (``cache_salt`` / ``extra_key``) has namespaced hashes, ``int64(SHA-256(seed ‖ hash as
  8-byte big-endian)[:8])`` with ``seed = SHA-256("sglang-kv-event-namespace-v1" ‖ namespace as UTF-8)``,
  and its events carry ``cache_salt`` = the namespace. (The contract does not spell out the seed's
  ``parts``; the namespace string is this emulator's reading.)
- ``AllBlocksCleared`` on a flush or a restart (``cleared``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from emulator.radix_node import Node
from emulator.storage import token_bytes

FORMATS = ("0.5.10", "0.5.23")
NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
GPU, CPU = "GPU", "CPU_PINNED"


def page_digests(prior: bytes, tokens: tuple[int, ...], page: int) -> tuple[bytes, ...]:
    """The chained SHA-256 digests of the pages of ``tokens`` after ``prior`` (b"" at a root)."""
    out: list[bytes] = []
    data = token_bytes(tokens)
    for i in range(0, len(tokens), page):
        prior = hashlib.sha256(prior + data[4 * i : 4 * (i + page)]).digest()
        out.append(prior)
    return tuple(out)


def block_hash(digest: bytes) -> int:
    """SGLang's ``hash_str_to_int64``: the first 16 hex digits, as a signed 64-bit integer."""
    return int.from_bytes(digest[:8], "big", signed=True)


def namespaced(value: int, namespace: str) -> int:
    """The 0.5.23 namespaced block hash of ``value`` in ``namespace``."""
    seed = hashlib.sha256(NAMESPACE_TAG + namespace.encode("utf-8", "surrogatepass")).digest()
    return block_hash(hashlib.sha256(seed + value.to_bytes(8, "big", signed=True)).digest())


class KvRecorder:
    """Queues the events of one radix tree in the chosen encoding (see the module docstring)."""

    def __init__(self, page: int, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"KV events format must be one of {FORMATS}, not {fmt!r}")
        self.page = page
        self.tagged_maps = fmt == "0.5.23"
        self.events: list[Any] = []

    def take(self) -> list[Any]:
        """Every queued event, oldest first; the queue is emptied (SGLang ``take_events``)."""
        events, self.events = self.events, []
        return events

    # ---- TreeEvents -------------------------------------------------------------------------------
    def gpu_on(self, node: Node) -> None:
        if not node.ev_hashes:
            prior = node.parent.ev_hashes[-1] if node.parent is not None and node.parent.ev_hashes else b""
            node.ev_hashes = page_digests(prior, node.key, self.page)
            self._stored(node, GPU)
        elif self.tagged_maps:
            self._stored(node, GPU)

    def gpu_off(self, node: Node) -> None:
        """Demotion to host (the node stays in the tree)."""
        if self.tagged_maps:
            self._removed(node, GPU)

    def host_on(self, node: Node) -> None:
        if self.tagged_maps and node.ev_hashes:
            self._stored(node, CPU)

    def deleted(self, node: Node) -> None:
        """``node`` leaves the tree; its tier flags are still those it had."""
        if not node.ev_hashes:
            return
        if not self.tagged_maps:
            self._removed(node, GPU)
            return
        if node.gpu:
            self._removed(node, GPU)
        if node.host:
            self._removed(node, CPU)

    def cleared(self) -> None:
        self.events.append({"type": "AllBlocksCleared"} if self.tagged_maps else ["AllBlocksCleared"])

    # ---- encoding ---------------------------------------------------------------------------------
    def _hashes(self, node: Node) -> list[int]:
        hashes = [block_hash(d) for d in node.ev_hashes]
        if self.tagged_maps and node.ns is not None:
            hashes = [namespaced(h, node.ns) for h in hashes]
        return hashes

    def _parent_hash(self, node: Node) -> int | None:
        parent = node.parent
        if parent is None or not parent.ev_hashes:
            return None
        h = block_hash(parent.ev_hashes[-1])
        return namespaced(h, parent.ns) if self.tagged_maps and parent.ns is not None else h

    def _stored(self, node: Node, medium: str) -> None:
        parent, p = self._parent_hash(node), self.page
        for i, h in enumerate(self._hashes(node)):
            tokens = list(node.key[i * p : (i + 1) * p])
            self.events.append(self._stored_event(h, parent, tokens, medium, node.ns))
            parent = h

    def _stored_event(
        self, h: int, parent: int | None, tokens: list[int], medium: str, ns: str | None
    ) -> Any:
        if not self.tagged_maps:
            return ["BlockStored", [h], parent, tokens, len(tokens), None, GPU]
        event = {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent, "token_ids": tokens}
        event |= {"block_size": len(tokens), "lora_id": None, "medium": medium}
        return event if ns is None else event | {"cache_salt": ns}

    def _removed(self, node: Node, medium: str) -> None:
        for h in self._hashes(node):
            if self.tagged_maps:
                self.events.append({"type": "BlockRemoved", "block_hashes": [h], "medium": medium})
            else:
                self.events.append(["BlockRemoved", [h], GPU])
