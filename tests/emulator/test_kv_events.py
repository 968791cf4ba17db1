"""The emulator's KV events (--kv-events-config): real ZMQ SUB / DEALER sockets on 127.0.0.1.

The subscriber binds a free port and the emulator's PUB connects to it (SGLang connects when the
endpoint has no wildcard). A SUB socket that binds sends its subscription only once the application
touches it, so ``Sub`` receives from the start in a task, and ``sync`` flushes the replica's cache until
an ``AllBlocksCleared`` batch arrives: from then on nothing is lost. Block hashes are recomputed here from
the recipe of sglang-contract.md §6, independently of the emulator's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import zmq
import zmq.asyncio

from emulator.config import parse_args
from emulator.kv_events import binds, offset_endpoint
from proxy.sync.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    decode_message,
    decode_replay,
    replay_request,
)
from tests.emulator.conftest import Emu, StartEmu

PAGE = 4
FAST = ("--emu-time-scale", "0.01", "--page-size", str(PAGE))
WAIT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chain(tokens: Sequence[int], page: int = PAGE) -> list[int]:
    """§6: int64(first 8 bytes of SHA-256(prior full digest ‖ tokens as uint32 LE)), chained per page."""
    prior, out = b"", []
    for i in range(0, len(tokens) // page * page, page):
        prior = hashlib.sha256(
            prior + b"".join(t.to_bytes(4, "little") for t in tokens[i : i + page])
        ).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def namespaced(h: int, ns: str) -> int:
    seed = hashlib.sha256(b"sglang-kv-event-namespace-v1" + ns.encode()).digest()
    return int.from_bytes(
        hashlib.sha256(seed + h.to_bytes(8, "big", signed=True)).digest()[:8], "big", signed=True
    )


class Sub:
    """A SUB socket bound on 127.0.0.1, decoding every message into ``batches`` from the start."""

    def __init__(self, ctx: zmq.asyncio.Context, topic: bytes = b"") -> None:
        self.port = free_port()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.subscribe(topic)
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.batches: list[EventBatch] = []
        self.frames: list[list[bytes]] = []
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            self.frames.append(frames)
            self.batches.append(decode_message(frames, merge=False))  # the engine's own events, page by page
            self._new.set()

    async def until(self, cond: Any, timeout_s: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout_s):
            while not cond():
                self._new.clear()
                await self._new.wait()

    def events(self, since: int = 0) -> list[KvEvent]:
        return [e for b in self.batches[since:] for e in b.events]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sock.close(linger=0)


class Zmq:
    """The test's ZMQ context: subscribers and replay clients, all closed at teardown."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.subs: list[Sub] = []

    def sub(self, topic: bytes = b"") -> Sub:
        sub = Sub(self.ctx, topic)
        self.subs.append(sub)
        return sub

    async def replay(self, port: int, start: int) -> list[EventBatch]:
        """Ask the replay endpoint for every buffered batch from ``start`` (a DEALER, bounded wait)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        got: list[EventBatch] = []
        try:
            async with asyncio.timeout(WAIT_S):
                await dealer.send_multipart([b"", replay_request(start)])
                while (batch := decode_replay(await dealer.recv_multipart(), merge=False)) is not None:
                    got.append(batch)
        finally:
            dealer.close(linger=0)
        return got

    async def close(self) -> None:
        for sub in self.subs:
            await sub.close()
        self.ctx.term()


@pytest.fixture
async def zq() -> AsyncIterator[Zmq]:
    z = Zmq()
    yield z
    await z.close()


def events_flag(sub: Sub, **extra: Any) -> tuple[str, str]:
    doc = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{sub.port}", **extra}
    return "--kv-events-config", json.dumps(doc)


async def sync(emu: Emu, sub: Sub) -> int:
    """Flush until an AllBlocksCleared batch arrives; returns how many batches ``sub`` had then."""
    async with asyncio.timeout(WAIT_S):
        while True:
            async with emu.http.post(emu.url + "/flush_cache") as resp:
                assert resp.status == 200
            with contextlib.suppress(TimeoutError):
                await sub.until(lambda: any(isinstance(e, AllBlocksCleared) for e in sub.events()), 0.1)
                return len(sub.batches)


async def generate(emu: Emu, ids: Sequence[int], **body: Any) -> None:
    payload = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 1}, **body}
    async with emu.http.post(emu.url + "/generate", json=payload) as resp:
        assert resp.status == 200, await resp.text()


def prompt(seed: int, n: int = 16) -> list[int]:
    return [1000 * seed + i for i in range(n)]


def stored(events: Sequence[KvEvent], medium: str | None = None) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored) and medium in (None, e.medium)]


def removed(events: Sequence[KvEvent], medium: str | None = None) -> list[int]:
    return [
        h
        for e in events
        if isinstance(e, BlockRemoved) and medium in (None, e.medium)
        for h in e.block_hashes
    ]


def stored_hashes(events: Sequence[KvEvent], medium: str | None = None) -> list[int]:
    return [h for e in stored(events, medium) for h in e.block_hashes]


async def test_a_request_stores_one_block_per_page_with_chained_hashes(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub(b"kv")
    emu = await emulator(*FAST, *events_flag(sub, topic="kv"))
    start = await sync(emu, sub)
    ids = prompt(1, 18)  # 4 whole pages (+ 2 tokens, + 1 output token: still 4 pages)
    await generate(emu, ids)
    want = chain(ids)
    await sub.until(lambda: len(stored(sub.events(start))) >= 4)
    blocks = stored(sub.events(start))
    assert [b.block_hashes for b in blocks] == [(h,) for h in want]
    assert [b.parent_block_hash for b in blocks] == [None, *want[:-1]]
    assert [b.token_ids for b in blocks] == [tuple(ids[i : i + PAGE]) for i in range(0, 16, PAGE)]
    assert {(b.block_size, b.medium, b.lora_id) for b in blocks} == {(PAGE, "GPU", None)}
    assert {b.encoding for b in sub.batches[start:]} == {"array"}
    assert all(f[0] == b"kv" for f in sub.frames)
    async with emu.http.get(emu.url + "/server_info") as resp:
        announced = json.loads((await resp.json())["kv_events_config"])
    assert announced["endpoint"] == f"tcp://127.0.0.1:{sub.port}" and announced["topic"] == "kv"
    seqs = [b.seq for b in sub.batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    # a continuation stores only its new pages, chained from the prompt's last page
    mark = len(sub.batches)
    await generate(emu, [*ids[:16], 7, 8, 9, 10, 11])
    await sub.until(lambda: len(stored(sub.events(mark))) >= 1)
    (block,) = stored(sub.events(mark))
    assert block.parent_block_hash == want[-1]
    assert block.block_hashes == (chain([*ids[:16], 7, 8, 9, 10])[-1],)


async def test_eviction_under_pressure_removes_the_blocks(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub()
    emu = await emulator(*FAST, "--max-total-tokens", "48", *events_flag(sub))
    start = await sync(emu, sub)
    first = prompt(1)
    for seed in (1, 2, 3, 4):
        await generate(emu, prompt(seed))
    await sub.until(lambda: set(chain(first)) <= set(removed(sub.events(start))))
    assert set(removed(sub.events(start))) <= set(stored_hashes(sub.events(start)))
    assert {e.medium for e in sub.events(start) if isinstance(e, BlockRemoved)} == {"GPU"}


HICACHE = ("--enable-hierarchical-cache", "--hicache-write-policy", "write_back", "--max-total-tokens", "40")


@pytest.mark.parametrize("fmt", ["0.5.10", "0.5.23"])
async def test_write_back_demotion_and_load_back(emulator: StartEmu, zq: Zmq, fmt: str) -> None:
    sub = zq.sub()
    emu = await emulator(*FAST, *HICACHE, "--emu-kv-events-format", fmt, *events_flag(sub))
    start = await sync(emu, sub)
    a, b = prompt(1, 24), prompt(2, 24)
    ha = chain(a)
    await generate(emu, a)
    await generate(emu, b)  # does not fit beside a: a is written back to host and leaves the GPU
    await generate(emu, a)  # a is loaded back from host
    await sub.until(lambda: set(chain(b)) <= set(stored_hashes(sub.events(start), "GPU")))
    await generate(emu, prompt(3, 4))  # one more batch after the load-back, to know it has been published
    await sub.until(lambda: set(chain(prompt(3, 4))) <= set(stored_hashes(sub.events(start))))
    ev = sub.events(start)
    mine = [e for e in ev if not isinstance(e, AllBlocksCleared) and set(e.block_hashes) & set(ha)]
    if fmt == "0.5.10":
        assert {e.medium for e in mine} == {"GPU"}
        assert stored_hashes(mine) == ha  # stored once: neither the demotion nor the load-back tells
        assert not removed(mine)
        assert {bt.encoding for bt in sub.batches[start:]} == {"array"}
    else:
        assert {bt.encoding for bt in sub.batches[start:]} == {"map"}
        kinds = [(type(e).__name__, e.medium) for e in mine if e.block_hashes == (ha[0],)]
        assert kinds == [
            ("BlockStored", "GPU"),  # first insert
            ("BlockStored", "CPU_PINNED"),  # the write-back lands on host
            ("BlockRemoved", "GPU"),  # demotion
            ("BlockStored", "GPU"),  # load-back
        ]


@pytest.mark.parametrize("fmt", ["0.5.10", "0.5.23"])
async def test_host_eviction_removes_the_host_copy(emulator: StartEmu, zq: Zmq, fmt: str) -> None:
    sub = zq.sub()
    flags = (*FAST, *HICACHE, "--hicache-ratio", "1.1", "--emu-kv-events-format", fmt)
    emu = await emulator(*flags, *events_flag(sub))
    start = await sync(emu, sub)
    for seed in range(1, 7):
        await generate(emu, prompt(seed, 24))
    ha = chain(prompt(1, 24))
    if fmt == "0.5.23":
        await sub.until(lambda: set(ha) <= set(removed(sub.events(start), "CPU_PINNED")))
        assert set(ha) <= set(removed(sub.events(start), "GPU"))  # the demotion, before
    else:  # one removal, when the last copy (on host) goes, still labelled GPU
        await sub.until(lambda: set(ha) <= set(removed(sub.events(start))))
        assert sorted(removed(sub.events(start))).count(ha[0]) == 1
        assert {e.medium for e in sub.events(start) if isinstance(e, BlockRemoved)} == {"GPU"}


async def test_flush_and_restart_clear_all_blocks(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub()
    emu = await emulator(*FAST, "--emu-enable-faults", *events_flag(sub))
    start = await sync(emu, sub)
    await generate(emu, prompt(1))
    await sub.until(lambda: len(stored(sub.events(start))) == 4)
    await emu.fault(action="restart")
    await sub.until(lambda: isinstance(sub.events(start)[-1], AllBlocksCleared))
    assert sub.batches[-1].events == (AllBlocksCleared(medium=None),)


async def test_replay_returns_the_buffered_batches_and_the_end_marker(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub()
    replay_port = free_port()
    extra = {"replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "buffer_steps": 3}
    emu = await emulator(*FAST, *events_flag(sub, **extra))
    await sync(emu, sub)
    for seed in (1, 2, 3):
        await generate(emu, prompt(seed))
    await sub.until(lambda: set(chain(prompt(3))) <= set(stored_hashes(sub.events())))
    live = {b.seq: b for b in sub.batches}
    last = max(live)
    got = await zq.replay(replay_port, 0)
    assert [b.seq for b in got] == [last - 2, last - 1, last]  # only buffer_steps batches are kept
    assert [(b.ts, b.events) for b in got] == [(live[b.seq].ts, live[b.seq].events) for b in got]


async def test_a_late_subscriber_fills_its_gap_by_replay(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub()
    replay_port = free_port()
    emu = await emulator(*FAST, *events_flag(sub, replay_endpoint=f"tcp://127.0.0.1:{replay_port}"))
    await sync(emu, sub)
    await generate(emu, prompt(1))
    await sub.until(lambda: len(stored(sub.events())) >= 4)
    seen = sub.batches[-1].seq + 1
    await sub.close()  # the subscriber goes away (a gap); the replica publishes on
    zq.subs.remove(sub)
    await generate(emu, prompt(2))
    await generate(emu, prompt(3))
    want = set(chain(prompt(2))) | set(chain(prompt(3)))
    got: list[EventBatch] = []
    async with asyncio.timeout(WAIT_S):  # the last batch may still be queued (flush lag): ask again
        while not want <= {h for b in got for h in stored_hashes(b.events)}:
            await asyncio.sleep(0.02)
            got = await zq.replay(replay_port, seen)
    assert [b.seq for b in got] == list(range(seen, seen + len(got)))


@pytest.mark.parametrize(("fmt", "publishes"), [("0.5.10", False), ("0.5.23", True)])
async def test_hybrid_models_publish_only_in_the_new_encoding(
    emulator: StartEmu, zq: Zmq, fmt: str, publishes: bool
) -> None:
    sub = zq.sub()
    emu = await emulator(*FAST, "--emu-hybrid", "--emu-kv-events-format", fmt, *events_flag(sub))
    for seed in (1, 2):
        await generate(emu, prompt(seed))
    async with emu.http.post(emu.url + "/flush_cache") as resp:
        assert resp.status == 200
    publisher = emu.replica.kv_events
    assert publisher is not None
    if publishes:
        await sub.until(lambda: any(isinstance(e, AllBlocksCleared) for e in sub.events()))
        assert stored(sub.events())
    else:
        await asyncio.sleep(0.1)
        assert publisher.seq == 0 and not publisher.buffer and not sub.batches


async def test_new_encoding_namespaces_hashes_by_cache_salt(emulator: StartEmu, zq: Zmq) -> None:
    sub = zq.sub()
    emu = await emulator(*FAST, "--emu-kv-events-format", "0.5.23", *events_flag(sub))
    start = await sync(emu, sub)
    ids = prompt(1)
    await generate(emu, ids, extra_key="tenant-a")
    await generate(emu, ids)
    await sub.until(lambda: len(stored(sub.events(start))) >= 8)
    blocks = stored(sub.events(start))
    salted = [b for b in blocks if b.cache_salt == "tenant-a"]
    plain = [b for b in blocks if b.cache_salt is None]
    assert [b.block_hashes[0] for b in plain] == chain(ids)
    assert [b.block_hashes[0] for b in salted] == [namespaced(h, "tenant-a") for h in chain(ids)]
    assert salted[1].parent_block_hash == salted[0].block_hashes[0]


def test_each_replica_publishes_on_its_own_ports() -> None:
    doc = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600"}
    cfg = parse_args(["--replicas", "3", "--port", "30000", "--kv-events-config", json.dumps(doc)])
    third = cfg.with_port(30002)
    assert third.replica_index == 2 and third.with_port(30002).replica_index == 2
    events = third.replica_kv_events
    assert events is not None
    assert (events.endpoint, events.replay_endpoint) == ("tcp://*:5559", "tcp://*:5602")
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert binds("tcp://*:1") and binds("ipc:///tmp/kv") and not binds("tcp://127.0.0.1:1")
    off = parse_args(["--kv-events-config", json.dumps({"publisher": None})])
    assert off.replica_kv_events is None
    for bad in ("{", '{"publisher": "kafka"}', '{"publisher": "zmq", "buffer_steps": "many"}'):
        with pytest.raises(SystemExit):
            parse_args(["--kv-events-config", bad])
