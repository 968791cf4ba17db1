"""proxy/sync/kv_wire.py decodes SGLang's KV-event messages, from bytes written here by hand per
sglang-contract.md §6 (msgpack literals and hand-assembled frames, never the emulator's output)."""

from __future__ import annotations

import struct

import msgpack
import pytest

from proxy.sync.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_batch,
    decode_message,
    decode_replay,
    decode_seq,
    replay_request,
)


def fixstr(text: str) -> bytes:
    assert len(text) < 32
    return bytes([0xA0 | len(text)]) + text.encode()


def test_a_literal_0_5_10_batch_with_a_negative_int64_hash() -> None:
    # [1.5, [["BlockRemoved", [-2 as int64], "GPU"], ["AllBlocksCleared"]], 0]
    payload = (
        b"\x93"
        + b"\xcb"
        + struct.pack(">d", 1.5)
        + b"\x92"
        + b"\x93"
        + fixstr("BlockRemoved")
        + b"\x91\xd3"
        + struct.pack(">q", -2)
        + fixstr("GPU")
        + b"\x91"
        + fixstr("AllBlocksCleared")
        + b"\x00"
    )
    batch = decode_message([b"kv", (7).to_bytes(8, "big"), payload])
    assert (batch.seq, batch.topic, batch.ts, batch.dp_rank, batch.encoding) == (7, b"kv", 1.5, 0, "array")
    assert batch.events == (BlockRemoved((-2,), "GPU"), AllBlocksCleared())


def test_a_literal_0_5_23_map_event() -> None:
    # [2, [{"type": "BlockRemoved", "block_hashes": [5], "medium": "CPU_PINNED"}], 1]
    event = (
        b"\x83"
        + fixstr("type")
        + fixstr("BlockRemoved")
        + fixstr("block_hashes")
        + b"\x91\x05"
        + fixstr("medium")
        + fixstr("CPU_PINNED")
    )
    batch = decode_batch(b"\x93\x02\x91" + event + b"\x01", seq=3)
    assert batch.events == (BlockRemoved((5,), "CPU_PINNED"),)
    assert (batch.seq, batch.ts, batch.dp_rank, batch.encoding) == (3, 2.0, 1, "map")


def test_block_stored_in_both_encodings() -> None:
    array = ["BlockStored", [-9], 4, [1, 2, 3, 4], 4, None, "GPU"]
    tagged = {
        "type": "BlockStored",
        "block_hashes": [-9],
        "parent_block_hash": 4,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "medium": "GPU",
        "cache_salt": "tenant",
    }
    a = decode_batch(msgpack.packb([0.0, [array], 0])).events[0]
    m = decode_batch(msgpack.packb([0.0, [tagged], 0])).events[0]
    assert a == BlockStored((-9,), 4, (1, 2, 3, 4), 4, None, "GPU")
    assert m == BlockStored((-9,), 4, (1, 2, 3, 4), 4, None, "GPU", cache_salt="tenant")


def test_trailing_defaults_may_be_left_out() -> None:
    events = [["BlockStored", [1], None, [7], 1], ["BlockRemoved", [1]]]
    batch = decode_batch(msgpack.packb([0.5, events]))
    assert batch.events == (BlockStored((1,), None, (7,), 1), BlockRemoved((1,)))
    assert batch.dp_rank is None


def test_replay_frames_and_the_end_marker() -> None:
    assert replay_request(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    payload = msgpack.packb([1.0, [["AllBlocksCleared"]], 0])
    got = decode_replay([b"", (258).to_bytes(8, "big"), payload])
    assert got is not None and got.seq == 258 and got.events == (AllBlocksCleared(),)
    assert decode_replay([b"\xff" * 8, b""]) is None
    assert decode_seq(b"\xff" * 8) == -1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0, [["NoSuchEvent"]], 0]),
        msgpack.packb([1.0, [["BlockRemoved", ["x"], "GPU"]], 0]),
        msgpack.packb([1.0, [["BlockRemoved", [1], "GPU", "extra"]], 0]),
        msgpack.packb([1.0, [["AllBlocksCleared"], {"type": "AllBlocksCleared"}], 0]),
        msgpack.packb([1.0, [{"block_hashes": [1]}], 0]),
        msgpack.packb(["now", [], 0]),
    ],
)
def test_malformed_payloads_are_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)


def test_malformed_frames_are_wire_errors() -> None:
    with pytest.raises(WireError):
        decode_message([b"topic", b"\x00\x01", b"\x90"])
    with pytest.raises(WireError):
        decode_message([b"only two", b"\x00" * 8])
