"""SGLang's KV-event wire format, decoded: ZMQ frames (bytes) -> typed events, no I/O.

A replica started with ``--kv-events-config`` publishes multipart messages ``[topic, seq, payload]`` on a
ZMQ PUB socket: ``seq`` is an 8-byte big-endian batch number (one more per batch) and ``payload`` is
msgpack of a batch ``[ts, [event, ...], attn_dp_rank]`` (sglang-contract.md §6). Two event encodings
exist and both are read here:

- SGLang 0.5.10: tagged positional arrays, ``["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``
  (trailing fields that hold their default may be left out);
- SGLang 0.5.23: tagged maps, ``{"type": "BlockStored", "block_hashes": ..., "medium": ...,
  "cache_salt": ...}`` (fields that are None may be left out).

The optional ROUTER replay endpoint answers a request ``replay_request(start_seq)`` with ``(seq,
payload)`` frames for every buffered batch from ``start_seq`` on, then the end marker ``seq = -1`` with an
empty payload (``decode_replay`` returns None for it). ``WireError`` names any malformed input. The
event types live in ``routing.kv_events`` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from routing.kv_events import (
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

__all__ = [
    "END_SEQ",
    "MEDIA",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvEvent",
    "WireError",
    "decode_batch",
    "decode_event",
    "decode_message",
    "decode_replay",
    "decode_seq",
    "replay_request",
]

END_SEQ = -1
"""The replay endpoint's end marker (``seq`` of the last reply frame)."""


class WireError(ValueError):
    """Bytes that are not a well-formed KV-event message."""


def decode_seq(data: bytes) -> int:
    """An 8-byte big-endian sequence number (``b"\\xff" * 8`` is the end marker, -1)."""
    if len(data) != 8:
        raise WireError(f"a sequence number has 8 bytes, not {len(data)}")
    return int.from_bytes(data, "big", signed=True)


def replay_request(start_seq: int) -> bytes:
    """The request frame asking the replay endpoint for every buffered batch with seq >= start_seq."""
    return start_seq.to_bytes(8, "big", signed=False)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """A PUB message ``[topic, seq, payload]``."""
    if len(frames) != 3:
        raise WireError(f"a KV-event message has 3 frames, not {len(frames)}")
    topic, seq, payload = frames
    return decode_batch(payload, decode_seq(seq), bytes(topic))


def decode_replay(frames: Sequence[bytes]) -> EventBatch | None:
    """A replay reply ``[seq, payload]`` (an empty ROUTER delimiter frame first is allowed); None for
    the end marker."""
    if len(frames) == 3 and not frames[0]:
        frames = frames[1:]
    if len(frames) != 2:
        raise WireError(f"a replay reply has 2 frames, not {len(frames)}")
    seq = decode_seq(frames[0])
    if seq == END_SEQ:
        return None
    return decode_batch(frames[1], seq)


def decode_batch(payload: bytes, seq: int = 0, topic: bytes = b"") -> EventBatch:
    """A msgpack batch ``[ts, events, dp_rank]`` (``dp_rank`` may be left out)."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"not msgpack: {exc}") from exc
    if not isinstance(obj, list) or not 2 <= len(obj) <= 3:
        raise WireError("a batch is an array [ts, events, dp_rank]")
    ts, raw_events = obj[0], obj[1]
    rank = obj[2] if len(obj) == 3 else None
    if not _is_number(ts) or not isinstance(raw_events, list) or not (rank is None or _is_int(rank)):
        raise WireError("a batch is [ts: float, events: array, dp_rank: int]")
    events = tuple(decode_event(e) for e in raw_events)
    kinds = {"map" if isinstance(e, dict) else "array" for e in raw_events}
    if len(kinds) > 1:
        raise WireError("a batch mixes array and map events")
    return EventBatch(seq, topic, float(ts), events, rank, kinds.pop() if kinds else "empty")


def decode_event(obj: object) -> KvEvent:
    """One event, in either encoding (an already unpacked msgpack value)."""
    if isinstance(obj, list) and obj and isinstance(obj[0], str):
        return _from_fields(obj[0], _positional(obj[0], obj[1:]))
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        return _from_fields(obj["type"], obj)
    raise WireError("an event is a tagged array or a map with a 'type'")


_ORDER = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": ("medium",),
}


def _positional(tag: str, values: list[Any]) -> dict[str, Any]:
    names = _ORDER.get(tag)
    if names is None:
        raise WireError(f"unknown event type {tag!r}")
    if len(values) > len(names):
        raise WireError(f"{tag} has at most {len(names)} fields, not {len(values)}")
    return dict(zip(names, values, strict=False))


def _from_fields(tag: str, f: Mapping[str, Any]) -> KvEvent:
    if tag == "BlockStored":
        return BlockStored(
            block_hashes=_ints(f, "block_hashes"),
            parent_block_hash=_opt_int(f, "parent_block_hash"),
            token_ids=_ints(f, "token_ids"),
            block_size=_int(f, "block_size"),
            lora_id=_opt_int(f, "lora_id"),
            medium=_medium(f),
            cache_salt=_opt_str(f, "cache_salt"),
            session_id=_opt_str(f, "session_id"),
            lora_name=_opt_str(f, "lora_name"),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(_ints(f, "block_hashes"), _medium(f))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared(_medium(f))
    raise WireError(f"unknown event type {tag!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return _is_int(v) or isinstance(v, float)


def _ints(f: Mapping[str, Any], name: str) -> tuple[int, ...]:
    v = f.get(name)
    if not isinstance(v, list) or not all(_is_int(x) for x in v):
        raise WireError(f"{name} must be an array of integers")
    return tuple(v)


def _int(f: Mapping[str, Any], name: str) -> int:
    v = f.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise WireError(f"{name} must be an integer")
    return v


def _opt_int(f: Mapping[str, Any], name: str) -> int | None:
    return None if f.get(name) is None else _int(f, name)


def _opt_str(f: Mapping[str, Any], name: str) -> str | None:
    v = f.get(name)
    if v is not None and not isinstance(v, str):
        raise WireError(f"{name} must be a string")
    return v


def _medium(f: Mapping[str, Any]) -> str | None:
    """The tier named by the event (one of ``MEDIA`` today; a newer name is passed on, not refused)."""
    return _opt_str(f, "medium")
