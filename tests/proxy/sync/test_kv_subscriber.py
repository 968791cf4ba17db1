"""The KV-event subscriber against real emulated replicas (real ZMQ sockets on 127.0.0.1), and its
sequence tracking on its own.

The replica's PUB connects to the endpoint the gateway's SUB binds (no wildcard: SGLang's PUB then
connects), so batches published before the gateway starts are lost to it: its first live batch has a
seq > 0 and the feed must replay 0 .. seq - 1 from the replica's ROUTER endpoint.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from proxy.sync import kv_feed
from proxy.sync.kv_feed import KvFeed, SeqTracker
from proxy.sync.kv_link import connect_endpoint
from proxy.sync.kv_subscriber import KV_SUBSCRIBER
from proxy.sync.kv_wire import decode_message
from routing.kv_events import BlockStored, EventBatch
from routing.prompt import PromptRequest, TokenPrompt
from routing.types import PrefixMatch
from tests.conftest import Emu, Emulators, Gw, StartGateway, wait_for
from tests.proxy.conftest import spy_threads

WAIT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def replica(emulator_server: Emulators, fmt: str, *more: str) -> Emu:
    doc = {
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{free_port()}",
        "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
    }
    flags = ("--emu-time-scale", "0.01", "--page-size", "16", "--emu-enable-faults")
    events = ("--kv-events-config", json.dumps(doc), "--emu-kv-events-format", fmt)
    return await emulator_server(*flags, *events, *more)


def can_bind(endpoint: str) -> bool:
    sock = zmq.Context.instance().socket(zmq.SUB)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError:
        return False
    finally:
        sock.close(linger=0)
    return True


async def generate(emu: Emu, ids: Sequence[int]) -> None:
    body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 1}}
    async with emu.http.post(emu.url + "/generate", json=body) as resp:
        assert resp.status == 200


async def complete(gw: Gw, ids: Sequence[int]) -> None:
    async with aiohttp.ClientSession() as http:
        body = {"model": next(iter(gw.gw.fleet.models())), "prompt": list(ids), "max_tokens": 1}
        async with http.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()


async def complete_until_heard(gw: Gw, emu: Emu) -> list[int]:
    """Completions with new token-id prompts until the gateway's SUB has received a batch (a PUB that
    connects drops what it publishes before the subscription reaches it); returns the last prompt."""
    async with asyncio.timeout(WAIT_S):
        for n in range(1000):
            ids = list(range(10_000 * (n + 1), 10_000 * (n + 1) + 130))
            await complete(gw, ids)
            await asyncio.sleep(0.05)
            if status(gw, emu).get("live_batches", 0) > 0:  # not only the catch-up replay's
                return ids
    raise AssertionError("no KV-event batch reached the gateway")


async def caught_up(gw: Gw, emu: Emu) -> None:
    """Until the gateway has applied every batch the replica has published. An answer can reach the
    client before the events of its own admission (an eviction among them) reach the gateway's SUB; the
    next request would then be routed on a model that has not heard of them yet: a delivery race of the
    test's back-to-back requests, not an error of the model."""
    publisher = emu.replica.kv_events
    assert publisher is not None
    await wait_for(lambda: status(gw, emu).get("last_seq") == publisher.seq - 1, WAIT_S)


def held(gw: Gw, emu: Emu, ids: Sequence[int]) -> PrefixMatch:
    router, fleet = gw.gw.router, gw.gw.fleet
    model = next(iter(fleet.models()))
    rreq = router.prepare(PromptRequest(model, TokenPrompt(tuple(ids))))
    return router.where(rreq, fleet.snapshot(model)).get(emu.url, PrefixMatch())


def status(gw: Gw, emu: Emu) -> dict[str, Any]:
    section: dict[str, Any] = gw.gw.metrics.sections()["kv_events"]
    return dict(section[emu.url])


@pytest.mark.parametrize("fmt", ["0.5.10", "0.5.23"])
async def test_events_arrive_a_late_join_is_replayed_and_a_restart_resets(
    emulator_server: Emulators, gateway: StartGateway, fmt: str
) -> None:
    emu = await replica(emulator_server, fmt)
    before = list(range(1000, 1200))  # 3 key blocks of 64, stored before any gateway listens
    await generate(emu, before)
    gw = await gateway([emu.url], kv_events="on")  # token-id prompts: exact without a tokenizer
    assert KV_SUBSCRIBER in gw.app
    theirs = await complete_until_heard(gw, emu)  # 2 key blocks, routed by this gateway
    await wait_for(lambda: status(gw, emu).get("replayed_batches", 0) > 0)  # the batches before the join
    await wait_for(lambda: held(gw, emu, before).total_tokens == 192.0)
    s = status(gw, emu)  # batches a connecting PUB dropped before it reached the SUB: a gap, replayed
    assert (s["mode"], s["encoding"], s["resets"]) == ("exact", "array" if fmt == "0.5.10" else "map", 0)
    assert held(gw, emu, theirs).gpu_tokens == 128.0
    assert f'kvroute_kv_exact{{replica="{emu.url}"}} 1.0' in gw.metrics()
    await emu.fault(action="restart")  # the replica publishes AllBlocksCleared
    await wait_for(lambda: held(gw, emu, before).total_tokens == 0.0)
    await generate(emu, before)
    await wait_for(lambda: held(gw, emu, before).total_tokens == 192.0)
    sub = gw.app[KV_SUBSCRIBER]
    endpoint = sub.feeds[emu.url][1].endpoint
    assert gw.gw.fleet.remove(emu.url)
    sub.reconcile()  # the replica left the fleet: its SUB closes and the address it bound is free
    assert sub.feeds == {}
    await wait_for(lambda: can_bind(endpoint))


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("off", "--kv-events off"),
        ("auto", "--kv-events auto without --tokenizer-path: text prompts are keyed by characters"),
    ],
)
async def test_a_gateway_with_kv_events_off_or_without_a_tokenizer_stays_learned(
    emulator_server: Emulators, gateway: StartGateway, mode: str, why: str
) -> None:
    emu = await replica(emulator_server, "0.5.23")
    gw = await gateway([emu.url], kv_events=mode)
    s = status(gw, emu)
    assert (s["mode"], s["why"]) == ("learned", why)
    assert gw.app[KV_SUBSCRIBER].feeds == {}


@pytest.mark.parametrize(
    ("seqs", "kinds"),
    [
        ([0, 1, 2], ["first", "next", "next"]),
        ([3, 4], ["gap", "next"]),  # a late join: 0..2 are missing
        ([0, 2, 3], ["first", "gap", "next"]),
        ([0, 1, 0], ["first", "next", "restart"]),
        ([5, 5], ["gap", "restart"]),
    ],
)
def test_the_seq_tracker_names_gaps_and_restarts(seqs: list[int], kinds: list[str]) -> None:
    t, got = SeqTracker(), []
    for seq in seqs:
        got.append(t.classify(seq))
        t.last = seq
    assert got == kinds


async def test_a_skipped_seq_without_replay_resets_and_a_late_join_does_not() -> None:
    ctx = zmq.asyncio.Context()
    applied: list[int] = []
    resets: list[str] = []
    port = free_port()
    feed = KvFeed(
        ctx, "r", f"tcp://127.0.0.1:{port}", True, None, "", lambda b: applied.append(b.seq), resets.append
    )
    try:
        for seq in (4, 5, 7, 2):
            await feed.accept(EventBatch(seq, b"", 1.0, (), 0, "empty"), 3.0)
    finally:
        feed.close()
        ctx.term()
    assert applied == [4, 5, 7, 2]
    assert resets == ["gap", "restart"]
    assert (feed.stats.gaps, feed.stats.resets, feed.stats.lag_s) == (1, 2, 2.0)


async def test_a_new_epoch_replays_the_new_publisher_without_waiting_for_a_live_batch() -> None:
    """The start time says the replica is a new process, whose first batches went out before the SUB
    reconnected: they are replayed from 0 at once, not when (if ever) an idle replica publishes again."""
    ctx = zmq.asyncio.Context()
    applied: list[int] = []
    feed = KvFeed(
        ctx,
        "r",
        f"tcp://127.0.0.1:{free_port()}",
        True,
        "tcp://127.0.0.1:1",
        "",
        lambda b: applied.append(b.seq),
        print,
    )
    asked: list[int] = []

    async def replay(start: int, upto: int | None) -> list[EventBatch]:
        asked.append(start)
        return [EventBatch(seq, b"", 1.0, (), 0, "new") for seq in (0, 1)]

    feed._replay = replay  # type: ignore[method-assign]  # the new process's ROUTER: seq 0 and 1 buffered
    try:
        for seq in range(6):
            await feed.accept(EventBatch(seq, b"", 1.0, (), 0, "old"), 1.0)
        feed.new_epoch()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (applied, asked, feed.stats.resets) == ([0, 1, 2, 3, 4, 5, 0, 1], [0], 0)
        await feed.accept(EventBatch(1, b"", 1.0, (), 0, "new"), 1.0)  # the live copy of a replayed batch
        assert feed.stats.duplicates == 1 and feed.seq.last == 1
    finally:
        feed.close()
        ctx.term()


async def test_after_a_reconnect_the_buffer_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches published while the SUB was away (or before its subscription reached the publisher) are
    replayed from the one after the last applied, without waiting for a live batch to show the gap."""
    monkeypatch.setattr(kv_feed, "LOOK_AGAIN_S", 0.0)
    ctx = zmq.asyncio.Context()
    applied: list[int] = []
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    feed = KvFeed(ctx, "r", endpoint, True, "tcp://127.0.0.1:1", "", lambda b: applied.append(b.seq), print)
    asked: list[int] = []

    async def replay(start: int, upto: int | None) -> list[EventBatch]:
        asked.append(start)
        return [EventBatch(seq, b"", 1.0, (), 0, "missed") for seq in (3, 4) if seq >= start]

    feed._replay = replay  # type: ignore[method-assign]
    try:
        for seq in range(3):
            await feed.accept(EventBatch(seq, b"", 1.0, (), 0, "live"), 1.0)
        feed._reconnected()
        await wait_for(lambda: applied == [0, 1, 2, 3, 4], 1.0)
        assert asked == [3] and feed.stats.resets == 0
    finally:
        feed.close()
        ctx.term()


def test_a_wildcard_endpoint_means_the_replicas_host() -> None:
    assert connect_endpoint("tcp://*:5557", "http://10.0.0.7:30000") == "tcp://10.0.0.7:5557"
    assert connect_endpoint("tcp://0.0.0.0:5557", "http://[fd00::1]:30000/") == "tcp://[fd00::1]:5557"
    assert connect_endpoint("tcp://10.1.1.1:5557", "http://10.0.0.7:30000") == "tcp://10.1.1.1:5557"
    assert connect_endpoint("ipc:///tmp/kv", "http://10.0.0.7:30000") == "ipc:///tmp/kv"


HICACHE = ("--enable-hierarchical-cache", "--hicache-write-policy", "write_back", "--hicache-ratio", "2")


@pytest.mark.parametrize(
    ("fmt", "tiers"), [("0.5.10", ()), ("0.5.23", ()), ("0.5.10", HICACHE), ("0.5.23", HICACHE)]
)
async def test_token_id_prompts_through_the_gateway_predict_the_reported_cached_tokens_exactly(
    emulator_server: Emulators, gateway: StartGateway, fmt: str, tiers: tuple[str, ...]
) -> None:
    emu = await replica(emulator_server, fmt, "--enable-cache-report", "--max-total-tokens", "2400", *tiers)
    gw = await gateway([emu.url], kv_events="on")  # token-id prompts, no tokenizer
    await complete_until_heard(gw, emu)
    docs = [list(range(100_000 * d, 100_000 * d + 640)) for d in range(1, 4)]  # 3 x 10 key blocks
    for turn in range(3):  # growing conversations over a GPU of 2400 tokens: the last turn evicts
        for d, doc in enumerate(docs):
            doc += range(100_000 * d + 50_000 + 64 * turn, 100_000 * d + 50_000 + 64 * (turn + 1))
            await caught_up(gw, emu)
            await complete(gw, doc)
    acc = gw.gw.router.accuracy()[emu.url]
    decisions = gw.gw.metrics.history.decisions()
    assert acc.requests >= 9 and sum(d.cached_tokens or 0 for d in decisions) > 0
    assert [
        (d.predicted_cached_tokens, d.cached_tokens)
        for d in decisions
        if d.predicted_cached_tokens != d.cached_tokens
    ] == []
    last_turn = sorted(d.cached_tokens or 0 for d in decisions[:3])
    assert last_turn == ([768, 768, 768] if tiers else [704, 768, 768])  # an evicted block: lost, or on host
    assert acc.error_ratio == 0.0


def _stored_pages(pages: int) -> list[bytes]:
    """One message holding a prompt's store page by page, as SGLang publishes it (16 tokens a page)."""
    events = [
        {"type": "BlockStored", "block_hashes": [i + 1], "parent_block_hash": i or None,
         "token_ids": list(range(16 * i, 16 * i + 16)), "block_size": 16, "lora_id": None, "medium": "GPU"}
        for i in range(pages)
    ]  # fmt: skip
    return [b"", (7).to_bytes(8, "big"), msgpack.packb([1.0, events, 0])]


async def test_a_large_message_is_decoded_in_a_thread_into_the_same_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = spy_threads(monkeypatch, kv_feed)
    small, large = _stored_pages(4), _stored_pages(2500)  # a 40K-token prompt: ~370 KB
    assert sum(map(len, small)) < kv_feed.THREAD_BYTES <= sum(map(len, large))
    assert await kv_feed.decode_off_loop(small) == decode_message(small) and threads == []
    batch = await kv_feed.decode_off_loop(large)
    assert batch == decode_message(large) and threads == [decode_message]
    (stored,) = batch.events  # the pages of one chain, merged into one event
    assert batch.seq == 7 and isinstance(stored, BlockStored) and len(stored.block_hashes) == 2500
