"""A prefill's rooms: where each prefill request meets the decode that receives its KV (pd-contract.md §2.3).

The prefill request and the decode's registration of the same bootstrap room arrive in either order.

- Prefill side: `claim(room, rid)` (a context manager) holds the room for the request; `wait_for_decode`
  keeps the request in the *bootstrap queue* until the decode registers (SGLang's KVPoll Bootstrapping →
  WaitingForInput: the prefill runs its forward pass only after its decode has admitted the request), or
  fails after the bootstrap timeout: 500 "Prefill bootstrap failed ... timed out after Xs in
  KVPoll.Bootstrapping". `send` models the KV transfer (the *inflight queue*: the prompt's bytes at the
  configured rate) and then hands the decode the prefill's outcome. Leaving the claim without sending
  fails the room for the decode: "Aborted by AbortReq." when the prefill request was aborted (its client,
  e.g. the router, went away), "Failed to get kvcache from prefill instance, it might be dead" otherwise.
- Decode side: `serve_decode(room, ...)` registers and waits for the outcome, `{"status": "success",
  "cached_tokens", "device", "host", "storage", "transfer_s"}` or `{"status": "failed", "reason"}`. A
  decode that leaves (its connection closed, its coroutine cancelled) is gone: the prefill's transfer then
  fails, 500 "Prefill transfer failed ... Decode instance could be dead, remote mooncake session ... is not
  alive".

A room is forgotten once both sides are done; one that a prefill failed before its decode came is kept
for SGLang's bootstrap-entry cleanup interval (120 s) so that the late decode fails at once. A prefill
that stops answers its waiting decodes "Losing connection with prefill instance (bootstrap_addr: H:P)",
what SGLang's decodes conclude from their missed heartbeats (one that dies unannounced leaves that to
their heartbeat, pd_link.py).

`LOCAL` maps the bootstrap address (host, port) of every prefill of this process to its rooms: a decode
of the same process calls them directly; any other reaches them over HTTP (pd_bootstrap.py, pd_link.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from emulator.pd_request import PdError, prefill_failed
from emulator.pd_stats import PdStats

ABORTED = "Aborted by AbortReq."
PREFILL_DEAD = "Failed to get kvcache from prefill instance, it might be dead"
CLEANUP_INTERVAL_S = 120.0  # SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL


@dataclass(eq=False, slots=True)
class Room:
    id: int
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # its decode registered
    outcome: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    decode: str | None = None  # the waiting decode's address; None when none waits
    claimed: bool = False
    prefill_done: bool = False
    decode_done: bool = False


@dataclass(eq=False, slots=True)
class Claim:
    """A prefill request's hold on its room."""

    room: Room
    rid: str
    tokens: int
    since: float  # loop time of the claim: the bootstrap timeout runs from here


class PrefillRooms:
    def __init__(self, stats: PdStats, time_scale: float, info: dict[str, Any]) -> None:
        self.stats = stats
        self.time_scale = time_scale
        self.info = info  # SGLang's PrefillServerInfo (GET /route with every rank -1)
        self.address = ""  # host:port of the bootstrap server, once it listens
        self.rooms: dict[int, Room] = {}

    def _room(self, room_id: int) -> Room:
        room = self.rooms.get(room_id)
        if room is None:
            room = self.rooms[room_id] = Room(room_id)
        return room

    # ---- prefill side ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def claim(self, room_id: int, rid: str, tokens: int) -> Iterator[Claim]:
        room = self._room(room_id)
        room.claimed = True
        reason = PREFILL_DEAD
        try:
            yield Claim(room, rid, tokens, asyncio.get_running_loop().time())
        except (asyncio.CancelledError, GeneratorExit):
            reason = ABORTED
            raise
        finally:
            self._settle(room, {"status": "failed", "reason": reason})
            room.prefill_done = True
            self._forget(room)

    async def wait_for_decode(self, claim: Claim) -> None:
        """Hold the request until its decode registers the room (PdError after the bootstrap timeout)."""
        stats, loop = self.stats, asyncio.get_running_loop()
        timeout = self.stats.cfg.bootstrap_timeout_s * self.time_scale
        stats.bootstrap_reqs += 1
        stats.bootstrap_tokens += claim.tokens
        try:
            async with asyncio.timeout(max(0.0, claim.since + timeout - loop.time())):
                await claim.room.arrived.wait()
        except TimeoutError:
            stats.on_bootstrap_failed()
            elapsed = (loop.time() - claim.since) / self.time_scale
            reason = f"Request {claim.room.id} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            raise prefill_failed("bootstrap", claim.rid, claim.room.id, reason) from None
        finally:
            stats.bootstrap_reqs -= 1
            stats.bootstrap_tokens -= claim.tokens

    async def send(self, claim: Claim, result: dict[str, Any], seconds: float, size: int) -> None:
        """Model the transfer (`seconds`, modelled), then give the decode `result` (PdError: it left)."""
        self.stats.inflight_reqs += 1
        try:
            await asyncio.sleep(seconds * self.time_scale)
        finally:
            self.stats.inflight_reqs -= 1
        room = claim.room
        if room.decode is None or room.outcome.done():
            self.stats.on_transfer_failed()
            reason = f"Decode instance could be dead, remote mooncake session {room.decode} is not alive"
            raise prefill_failed("transfer", claim.rid, room.id, reason)
        self.stats.on_transfer(seconds, size)
        self._settle(room, {"status": "success", **result, "transfer_s": seconds})

    # ---- decode side ----------------------------------------------------------------------------
    async def serve_decode(self, room_id: int, decode: str) -> dict[str, Any]:
        """Register the decode at `decode` for the room and wait for the prefill's outcome."""
        room = self._room(room_id)
        if room.decode is not None:
            return {"status": "failed", "reason": f"bootstrap_room {room_id} is already registered"}
        room.decode = decode
        room.arrived.set()
        try:
            return await asyncio.shield(room.outcome)
        finally:
            room.decode = None
            room.decode_done = True
            self._forget(room)

    # ---- both -----------------------------------------------------------------------------------
    def close(self) -> None:
        """The prefill stops: every waiting decode fails at once."""
        reason = f"Losing connection with prefill instance (bootstrap_addr: {self.address})"
        for room in list(self.rooms.values()):
            self._settle(room, {"status": "failed", "reason": reason})
        self.rooms.clear()

    @staticmethod
    def _settle(room: Room, outcome: dict[str, Any]) -> None:
        if not room.outcome.done():
            room.outcome.set_result(outcome)

    def _forget(self, room: Room) -> None:
        """Drop the room once both sides are done with it (a failed room waits a while for its decode)."""
        if self.rooms.get(room.id) is not room:
            return
        if room.prefill_done and not room.arrived.is_set():
            delay = CLEANUP_INTERVAL_S * self.time_scale
            asyncio.get_running_loop().call_later(delay, self._drop, room)
        elif room.decode_done and (room.prefill_done or not room.claimed):
            del self.rooms[room.id]

    def _drop(self, room: Room) -> None:
        if self.rooms.get(room.id) is room:
            del self.rooms[room.id]


LOCAL: dict[tuple[str, int], PrefillRooms] = {}
"""The rooms of this process's prefills by bootstrap address (host, port): a same-process decode's peer."""


def local_rooms(host: str | None, port: int) -> PrefillRooms | None:
    return LOCAL.get((host or "", port))


__all__ = ["ABORTED", "LOCAL", "PREFILL_DEAD", "Claim", "PdError", "PrefillRooms", "local_rooms"]
