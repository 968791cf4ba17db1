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

SGLang publishes one ``BlockStored`` per page; a batch's chains of pages come out merged into one event
each (``Runs``), which the cache model applies exactly as the pages one by one (tests/proxy/
test_kv_runs.py), at a fraction of the cost.
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


def decode_message(frames: Sequence[bytes], merge: bool = True) -> EventBatch:
    """A PUB message ``[topic, seq, payload]`` (``merge``: see ``decode_batch``)."""
    if len(frames) != 3:
        raise WireError(f"a KV-event message has 3 frames, not {len(frames)}")
    topic, seq, payload = frames
    return decode_batch(payload, decode_seq(seq), bytes(topic), merge)


def decode_replay(frames: Sequence[bytes], merge: bool = True) -> EventBatch | None:
    """A replay reply ``[seq, payload]`` (an empty ROUTER delimiter frame first is allowed); None for
    the end marker."""
    if len(frames) == 3 and not frames[0]:
        frames = frames[1:]
    if len(frames) != 2:
        raise WireError(f"a replay reply has 2 frames, not {len(frames)}")
    seq = decode_seq(frames[0])
    if seq == END_SEQ:
        return None
    return decode_batch(frames[1], seq, merge=merge)


def decode_batch(payload: bytes, seq: int = 0, topic: bytes = b"", merge: bool = True) -> EventBatch:
    """A msgpack batch ``[ts, events, dp_rank]`` (``dp_rank`` may be left out); with ``merge``, runs of
    page events are merged (``Runs``)."""
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
    runs, maps = Runs(merge), 0
    for raw in raw_events:
        if type(raw) is dict:
            maps += 1
            tag = raw.get("type")
            if type(tag) is not str:
                raise WireError("an event is a tagged array or a map with a 'type'")
            runs.add(tag, raw)
        elif isinstance(raw, list) and raw and isinstance(raw[0], str):
            runs.add(raw[0], _positional(raw[0], raw[1:]))
        else:
            raise WireError("an event is a tagged array or a map with a 'type'")
    if 0 < maps < len(raw_events):
        raise WireError("a batch mixes array and map events")
    encoding = ("map" if maps else "array") if raw_events else "empty"
    return EventBatch(seq, topic, float(ts), runs.events(), rank, encoding)


class Runs:
    """A batch's events, with every run of chained ``BlockStored`` pages (each one's parent the run's last
    page, all pages whole, alike in size, adapter, medium and namespace) merged into one event, and every
    run of ``BlockRemoved`` of one medium into one. SGLang publishes one event per page, so a prefill of
    16K tokens is a thousand events: built and applied one by one they cost the gateway ~19 us each on a
    captured agent stream (1.6K events per modelled second), most of its event loop in the benchmark.
    A run's fields are checked once, when it ends (``_from_fields``); per event only its shape is."""

    def __init__(self, merge: bool = True) -> None:
        self._merge = merge
        self._out: list[KvEvent] = []
        self._tag = ""
        self._first: Mapping[str, Any] = {}
        self._n = 0
        self._hashes: list[Any] = []
        self._ids: list[Any] = []
        self._same: tuple[Any, ...] = ()

    def add(self, tag: str, f: Mapping[str, Any]) -> None:
        alike = _ALIKE.get(tag)
        if alike is None:  # AllBlocksCleared, or an unknown type (refused by _from_fields)
            self._end()
            self._out.append(_from_fields(tag, f))
            return
        hashes, ids, same = f.get("block_hashes"), f.get("token_ids"), tuple(f.get(k) for k in alike)
        lists = type(hashes) is list and (tag == "BlockRemoved" or type(ids) is list)
        if lists and self._continues(tag, same, f.get("parent_block_hash")):
            self._hashes += _listed(hashes)
            self._ids += _listed(ids)
            self._n += 1
            return
        self._end()
        self._tag, self._first, self._same, self._n = tag, f, same, 1
        self._hashes, self._ids = list(_listed(hashes)), list(_listed(ids))

    def events(self) -> tuple[KvEvent, ...]:
        self._end()
        return tuple(self._out)

    def _continues(self, tag: str, same: tuple[Any, ...], parent: object) -> bool:
        if not self._merge or tag != self._tag or same != self._same or not self._hashes:
            return False
        if tag == "BlockRemoved":
            return True
        size = same[0]
        return parent == self._hashes[-1] and type(size) is int and len(self._ids) == len(self._hashes) * size

    def _end(self) -> None:
        if self._n == 1:
            self._out.append(_from_fields(self._tag, self._first))
        elif self._n:
            merged = {**self._first, "block_hashes": self._hashes}
            if self._tag == "BlockStored":
                merged["token_ids"] = self._ids
            self._out.append(_from_fields(self._tag, merged))
        self._tag, self._n = "", 0


_ALIKE = {  # the fields a run's events share
    "BlockStored": ("block_size", "lora_id", "medium", "cache_salt", "session_id", "lora_name"),
    "BlockRemoved": ("medium",),
}


def _listed(v: object) -> list[Any] | tuple[()]:
    """A list field as given (checked when its run ends), or nothing to extend a run with."""
    return v if type(v) is list else ()


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
    """An array of integers (no booleans). The element types are checked by ``map(type, ...)`` into a
    set, a C loop: a page's event carries its token ids, and checking each in Python made the check
    most of the gateway's time per event (16.6 us of 22 us on a captured agent stream)."""
    v = f.get(name)
    if type(v) is not list or (v and set(map(type, v)) != _INT_ONLY):
        raise WireError(f"{name} must be an array of integers")
    return tuple(v)


_INT_ONLY = {int}


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
