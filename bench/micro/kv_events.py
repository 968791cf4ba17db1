"""Micro-benchmark of exact mode's event handling: decode + apply, as a share of one core (not a test).

    python -m bench.micro.kv_events [--replicas 16] [--rate 50] [--seconds 20] [--per-batch 5]

A synthetic but realistic stream per replica, in the wire format of both encodings (msgpack frames as
``proxy/sync/kv_wire.py`` reads them): 60% ``BlockStored`` of one radix node of 1-4 pages of 16 tokens,
extending a random recent live node (a new root one time in five) and, in the 0.5.23 encoding, half of
them followed later by the node's host copy (``CPU_PINNED``); 40% ``BlockRemoved`` of the oldest leaf
node (a radix tree evicts leaves first).
``--rate`` events per second per replica in batches of ``--per-batch`` events. Every frame is decoded
(``decode_message``) and applied (``Router.apply_kv_events``), timed with ``time.process_time``; the
share of one core is that CPU time over the ``--seconds`` of traffic it stands for.

Target (issue 17): 16 replicas x 50 events/s < 10% of one core.
"""

from __future__ import annotations

import argparse
import random
import time

import msgpack

from proxy.sync.kv_wire import decode_message
from routing.config import RoutingConfig
from routing.router import Router
from routing.types import ReplicaState

PAGE = 16


class Stream:
    """One replica's events (wire-shaped), from a growing and shrinking forest of nodes."""

    def __init__(self, rng: random.Random, tagged_maps: bool) -> None:
        self.rng = rng
        self.maps = tagged_maps
        self.next_hash = 1
        self.live: dict[
            int, tuple[list[int], int | None]
        ] = {}  # node tip -> (pages, parent tip), oldest first
        self.children: dict[int, int] = {}  # node tip -> live children (only leaves are removed)
        self.pending_host: list[tuple[list[int], int | None, list[int]]] = []

    def event(self) -> object:
        if len(self.live) > 50 and self.rng.random() < 0.4:
            leaf = next((t for t in self.live if not self.children.get(t)), None)
            if leaf is not None:
                return self._remove(leaf)
        if self.maps and self.pending_host and self.rng.random() < 0.3:
            return self._stored(*self.pending_host.pop(0), medium="CPU_PINNED")
        return self._new_node()

    def _new_node(self) -> object:
        tips = list(self.live)[-200:]
        parent = None if not tips or self.rng.random() < 0.2 else self.rng.choice(tips)
        pages = self.rng.randint(1, 4)
        hashes = list(range(self.next_hash, self.next_hash + pages))
        self.next_hash += pages
        tokens = [self.rng.randrange(32_000) for _ in range(pages * PAGE)]
        self.live[hashes[-1]] = (hashes, parent)
        if parent is not None:
            self.children[parent] = self.children.get(parent, 0) + 1
        if self.maps and self.rng.random() < 0.5:
            self.pending_host.append((hashes, parent, tokens))
        return self._stored(hashes, parent, tokens)

    def _remove(self, tip: int) -> object:
        hashes, parent = self.live.pop(tip)
        self.children.pop(tip, None)
        if parent is not None:
            self.children[parent] -= 1
        self.pending_host = [p for p in self.pending_host if p[0][-1] != tip]
        return self._removed(hashes)

    def _stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], medium: str = "GPU"
    ) -> object:
        if not self.maps:
            return ["BlockStored", hashes, parent, tokens, PAGE, None, "GPU"]
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": tokens, "block_size": PAGE, "lora_id": None, "medium": medium}  # fmt: skip

    def _removed(self, hashes: list[int]) -> object:
        if not self.maps:
            return ["BlockRemoved", hashes, "GPU"]
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def frames(stream: Stream, batches: int, per_batch: int) -> list[list[bytes]]:
    out = []
    for seq in range(batches):
        payload = msgpack.packb([time.time(), [stream.event() for _ in range(per_batch)], 0])
        out.append([b"", seq.to_bytes(8, "big"), payload])
    return out


def run(replicas: int, rate: float, seconds: float, per_batch: int, fmt: str) -> tuple[float, int]:
    """CPU seconds to decode and apply ``seconds`` of traffic, and the events it held."""
    rng = random.Random(17)
    router = Router(RoutingConfig())
    states = [
        ReplicaState(
            f"r{i}", gpu_tokens=500_000, host_tokens=2_000_000, page_size=PAGE, write_policy="write_back"
        )
        for i in range(replicas)
    ]
    router.sync(states)
    batches = max(1, int(rate * seconds / per_batch))
    wire = {s.id: frames(Stream(rng, fmt == "0.5.23"), batches, per_batch) for s in states}
    order = [(rid, f) for i in range(batches) for rid, fs in wire.items() for f in fs[i : i + 1]]
    t0 = time.process_time()
    for rid, f in order:
        router.apply_kv_events(rid, decode_message(f), "m")
    cpu = time.process_time() - t0
    mode = router.kv_mode("r0")
    print(
        f"  r0: {mode.mode}, {mode.pages} pages mapped, {mode.orphans} orphan pages, {mode.dropped} dropped"
    )
    return cpu, batches * per_batch * replicas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate", type=float, default=50.0, help="events per second per replica")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--per-batch", type=int, default=5)
    a = ap.parse_args()
    for fmt in ("0.5.10", "0.5.23"):
        cpu, events = run(a.replicas, a.rate, a.seconds, a.per_batch, fmt)
        share = 100.0 * cpu / a.seconds
        print(
            f"{fmt}: {a.replicas} replicas x {a.rate:g} events/s, {events} events in {cpu * 1e3:.1f} ms CPU: "
            f"{cpu / events * 1e6:.1f} us/event, {share:.2f}% of one core"
        )


if __name__ == "__main__":
    main()
