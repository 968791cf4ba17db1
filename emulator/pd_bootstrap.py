"""A prefill's bootstrap server: SGLang's `CommonKVBootstrapServer` routes plus the emulator's KV data path.

An aiohttp server on `--host`:`--disaggregation-bootstrap-port` (+ the replica's index; 0 binds a free
port), started only on a prefill, as SGLang's tokenizer manager does (pd-contract.md §2.2):

    GET  /health                   "OK"
    PUT  /route                    a prefill rank registers {attn_tp_size/rank, attn_cp_size/rank,
                                   attn_dp_size/rank, pp_size/rank, system_dp_size/rank, rank_ip, rank_port,
                                   page_size, kv_cache_dtype[, load_balance_method]} → "OK"
    GET  /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1
                                   PrefillServerInfo {attn_tp_size, attn_cp_size, dp_size, pp_size,
                                   page_size, kv_cache_dtype, follow_bootstrap_room}
    GET  /route?<ranks>            {rank_ip, rank_port} of one rank; 404 for an unknown one
    POST /register_dp_rank         {bootstrap_room, dp_rank} → "OK"
    POST /query_dp_ranks           {bootstrap_rooms: [...]} → {"<room>": dp_rank} for the known ones
    POST /_emu/pd/kv               the emulator's data path (SGLang sends KV over RDMA and control
                                   messages over ZMQ): {bootstrap_room, decode} registers a decode for the
                                   room and answers once the prefill sent the KV (pd_rooms.py)

A missing query argument is 400 "Missing inputs for bootstrap server.". The replica registers its own
ranks at start (every DP rank, TP rank 0..tp_size-1, CP and PP rank 0), each pointing at this server as
its `rank_ip:rank_port`, so the server is ready at once.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from emulator.errors import json_response
from emulator.pd_rooms import PrefillRooms

_RANKS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
_PUT_KEYS = ("attn_dp_rank", "attn_cp_rank", "attn_tp_rank", "pp_rank", "rank_ip", "rank_port")
DP_RANK_TTL_S = 120.0  # SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL
Rank = tuple[int, int, int, int]  # (dp, cp, tp, pp)


class BootstrapServer:
    def __init__(self, rooms: PrefillRooms, host: str, port: int, tp_size: int) -> None:
        self.rooms = rooms
        self.host = host
        self.port = port
        self.tp_size = tp_size
        self.ranks: dict[Rank, dict[str, Any]] = {}
        self.dp_ranks: dict[int, tuple[int, float]] = {}  # room -> (dp rank, registered at)
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Listen (OSError when the port is taken) and register this replica's ranks; the bound port."""
        app = web.Application()
        r = app.router
        r.add_get("/health", self._health)
        r.add_route("*", "/route", self._route)
        r.add_post("/register_dp_rank", self._register_dp_rank)
        r.add_post("/query_dp_ranks", self._query_dp_ranks)
        r.add_post("/_emu/pd/kv", self._kv)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        rank_ip = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        for dp in range(int(self.rooms.info["dp_size"])):
            for tp in range(self.tp_size):
                self.ranks[(dp, 0, tp, 0)] = {"rank_ip": rank_ip, "rank_port": self.port}
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return await self._route_put(request)
        if request.method != "GET":
            return web.Response(text="Method not allowed", status=405, content_type="application/json")
        values = [request.query.get(name) for name in _RANKS]
        try:
            rank = tuple(int(v) for v in values if v)
        except ValueError:
            rank = ()
        if len(rank) != len(_RANKS):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        if rank == (-1, -1, -1, -1):
            return json_response(self.rooms.info)
        info = self.ranks.get((rank[0], rank[1], rank[2], rank[3]))
        if info is None:
            dp, cp, tp, pp = rank
            text = f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
            return web.Response(text=text, status=404)
        return json_response(info)

    async def _route_put(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            dp, cp, tp, pp = (int(data[key]) for key in _PUT_KEYS[:4])
            self.ranks[(dp, cp, tp, pp)] = {
                "rank_ip": str(data["rank_ip"]),
                "rank_port": int(data["rank_port"]),
            }
        except (ValueError, KeyError, TypeError):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        return web.Response(text="OK")

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            room, dp_rank = int(data["bootstrap_room"]), int(data["dp_rank"])
        except (ValueError, KeyError, TypeError):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        now = time.monotonic()
        ttl = DP_RANK_TTL_S * self.rooms.time_scale
        self.dp_ranks = {k: v for k, v in self.dp_ranks.items() if now - v[1] <= ttl}
        self.dp_ranks[room] = (dp_rank, now)
        return web.Response(text="OK")

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        try:
            rooms = [int(room) for room in (await request.json())["bootstrap_rooms"]]
        except (ValueError, KeyError, TypeError):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        return json_response({str(room): self.dp_ranks[room][0] for room in rooms if room in self.dp_ranks})

    async def _kv(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            room, decode = int(data["bootstrap_room"]), str(data.get("decode", request.remote))
        except (ValueError, KeyError, TypeError):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        return json_response(await self.rooms.serve_decode(room, decode))
