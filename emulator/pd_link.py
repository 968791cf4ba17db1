"""A decode's side of the KV handshake: find the prefill a request names, register its room, wait for the KV.

As SGLang's decode does (pd-contract.md §2.3, §2.4), once the request holds its KV memory (admitted by
the engine: the prealloc queue is behind it):

1. Resolve the prefill at `bootstrap_host:bootstrap_port`: its PrefillServerInfo (`GET /route` with every
   rank -1), then the rank that serves the room (`room % dp_size` when it follows the bootstrap room,
   else 0: `GET /route?prefill_dp_rank=...`). Resolved addresses are cached. Up to 15 tries at least 1 s
   apart, then 500 "Decode handshake failed ... Could not fetch prefill parallel info from
   bootstrap_addr: H:P". A prefill of another page size or KV-cache dtype fails the handshake as well.
2. Register the room with that rank and wait for the KV (the transfer queue): the prefill answers once
   its transfer is done, with its cached-token counts. After the waiting timeout: 500 "Decode transfer
   failed ... timed out after Xs in KVPoll.WaitingForInput". Meanwhile a remote prefill's bootstrap
   server is pinged (`GET /health`) every heartbeat interval; 2 failures in a row: "... Losing connection
   with prefill instance (bootstrap_addr: H:P)". A prefill that failed or dropped the room: its reason.

The peer is the prefill's rooms when it runs in this process (pd_rooms.LOCAL), else HTTP: the bootstrap
server's routes and the emulator's data-path route `POST /_emu/pd/kv` (pd_bootstrap.py), long-polled;
closing that request tells the prefill that the decode left. Durations are modelled seconds x time scale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp

from emulator.pd_config import HANDSHAKE_ATTEMPTS, PdConfig
from emulator.pd_request import Bootstrap, decode_failed
from emulator.pd_rooms import PREFILL_DEAD, PrefillRooms, local_rooms
from emulator.pd_stats import PdStats

_QUICK = aiohttp.ClientTimeout(total=5.0)
_ALL_RANKS = {
    "prefill_dp_rank": "-1",
    "prefill_cp_rank": "-1",
    "target_tp_rank": "-1",
    "target_pp_rank": "-1",
}


class _Mismatch(Exception):
    """The prefill's page size or KV-cache dtype differs from the decode's (SGLang refuses the pair)."""


class Peer(Protocol):
    remote: bool

    async def info(self) -> dict[str, Any] | None: ...
    async def rank(self, dp_rank: int) -> str | None: ...
    async def transfer(self, target: str, room: int, decode: str) -> dict[str, Any]: ...
    async def alive(self) -> bool: ...


class LocalPeer:
    """A prefill of this process."""

    remote = False

    def __init__(self, rooms: PrefillRooms) -> None:
        self.rooms = rooms

    async def info(self) -> dict[str, Any] | None:
        return self.rooms.info

    async def rank(self, dp_rank: int) -> str | None:
        return "local"

    async def transfer(self, target: str, room: int, decode: str) -> dict[str, Any]:
        return await self.rooms.serve_decode(room, decode)

    async def alive(self) -> bool:
        return True


class HttpPeer:
    """A prefill reached through its bootstrap server."""

    remote = True

    def __init__(self, session: aiohttp.ClientSession, address: str) -> None:
        self.session = session
        self.base = f"http://{address}"

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            async with self.session.get(self.base + path, params=params, timeout=_QUICK) as resp:
                return await resp.json() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def info(self) -> dict[str, Any] | None:
        doc = await self._get("/route", _ALL_RANKS)
        return doc if isinstance(doc, dict) else None

    async def rank(self, dp_rank: int) -> str | None:
        params = {"prefill_dp_rank": str(dp_rank), "prefill_cp_rank": "0", "target_tp_rank": "0"}
        doc = await self._get("/route", params | {"target_pp_rank": "0"})
        if not isinstance(doc, dict) or "rank_ip" not in doc or "rank_port" not in doc:
            return None
        return f"http://{doc['rank_ip']}:{doc['rank_port']}/_emu/pd/kv"

    async def transfer(self, target: str, room: int, decode: str) -> dict[str, Any]:
        body = {"bootstrap_room": room, "decode": decode}
        async with self.session.post(target, json=body, timeout=aiohttp.ClientTimeout()) as resp:
            doc = await resp.json()
        return doc if isinstance(doc, dict) else {"status": "failed", "reason": "bad answer"}

    async def alive(self) -> bool:
        try:
            async with self.session.get(self.base + "/health", timeout=_QUICK) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


class DecodeLink:
    """The handshake and KV wait of one decode replica (one per replica, shared by its requests)."""

    def __init__(
        self,
        cfg: PdConfig,
        own: tuple[int, str],
        stats: PdStats,
        session: aiohttp.ClientSession,
        me: Callable[[], str],
        time_scale: float,
    ) -> None:
        self.cfg = cfg
        self.own = own  # (page_size, kv_cache_dtype): a prefill must match them
        self.stats = stats
        self.session = session
        self.me = me  # this decode's address (host:port), for the prefill's messages
        self.scale = time_scale
        self._targets: dict[tuple[str, int], str] = {}  # (bootstrap address, dp rank) -> data path

    def _peer(self, boot: Bootstrap) -> Peer:
        rooms = local_rooms(boot.host, boot.port)
        return LocalPeer(rooms) if rooms is not None else HttpPeer(self.session, boot.address)

    async def receive(self, boot: Bootstrap, rid: str) -> dict[str, Any]:
        """The prefill's success outcome for the room (PdError on any failure)."""
        assert boot.room is not None
        peer = self._peer(boot)
        target = await self._handshake(peer, boot, rid)
        self.stats.transfer_reqs += 1
        try:
            return await self._wait(peer, target, boot, rid)
        finally:
            self.stats.transfer_reqs -= 1

    async def _resolve(self, peer: Peer, boot: Bootstrap) -> str | None:
        """The data path of the rank serving the room; None while unreachable, _Mismatch if unusable."""
        info = await peer.info()
        if info is None:
            return None
        theirs = (info.get("page_size"), info.get("kv_cache_dtype"))
        if theirs != self.own:
            raise _Mismatch(f"Page size or KV cache dtype mismatch: prefill {theirs}, decode {self.own}")
        dp_size = int(info.get("dp_size") or 1)
        dp = (boot.room or 0) % dp_size if info.get("follow_bootstrap_room", True) else 0
        key = (boot.address, dp)
        if key not in self._targets:
            target = await peer.rank(dp)
            if target is None:
                return None
            self._targets[key] = target
        return self._targets[key]

    async def _handshake(self, peer: Peer, boot: Bootstrap, rid: str) -> str:
        room = boot.room or 0
        for attempt in range(HANDSHAKE_ATTEMPTS):
            try:
                target = await self._resolve(peer, boot)
            except _Mismatch as exc:
                self.stats.on_bootstrap_failed()
                raise decode_failed("handshake", rid, room, str(exc)) from None
            if target is not None:
                return target
            if attempt + 1 < HANDSHAKE_ATTEMPTS:
                await asyncio.sleep(self.scale)
        self.stats.on_bootstrap_failed()
        reason = f"Could not fetch prefill parallel info from bootstrap_addr: {boot.address}"
        raise decode_failed("handshake", rid, room, reason)

    async def _heartbeat(self, peer: Peer) -> None:
        """Returns when the prefill missed `heartbeat_max_failure` pings in a row."""
        failures = 0
        while failures < self.cfg.heartbeat_max_failure:
            await asyncio.sleep(self.cfg.heartbeat_interval_s * self.scale)
            failures = 0 if await peer.alive() else failures + 1

    async def _wait(self, peer: Peer, target: str, boot: Bootstrap, rid: str) -> dict[str, Any]:
        room, loop = boot.room or 0, asyncio.get_running_loop()
        start = loop.time()
        poll = asyncio.ensure_future(peer.transfer(target, room, self.me()))
        beat = asyncio.ensure_future(self._heartbeat(peer)) if peer.remote else None
        pending: set[asyncio.Future[Any]] = {poll} if beat is None else {poll, beat}
        try:
            while pending:
                left = start + self.cfg.waiting_timeout_s * self.scale - loop.time()
                done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                if poll in done and poll.exception() is None:
                    return self._outcome(poll.result(), boot, rid)
                if poll in done and beat is None:  # a local prefill cannot drop the line: it failed
                    raise decode_failed("transfer", rid, room, self._failed(PREFILL_DEAD))
                if beat is not None and beat in done:
                    reason = f"Losing connection with prefill instance (bootstrap_addr: {boot.address})"
                    raise decode_failed("transfer", rid, room, self._failed(reason))
        finally:
            tasks = [task for task in (poll, beat) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # a long poll cut off is expected
        elapsed = (loop.time() - start) / self.scale
        reason = f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"
        raise decode_failed("transfer", rid, room, self._failed(reason))

    def _outcome(self, outcome: dict[str, Any], boot: Bootstrap, rid: str) -> dict[str, Any]:
        if outcome.get("status") == "success":
            return outcome
        reason = str(outcome.get("reason", "transfer failed"))
        raise decode_failed("transfer", rid, boot.room or 0, self._failed(reason))

    def _failed(self, reason: str) -> str:
        self.stats.on_transfer_failed()
        return reason
