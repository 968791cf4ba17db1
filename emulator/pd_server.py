"""A replica in prefill/decode disaggregation (`--disaggregation-mode prefill|decode`): `install(app, cfg)`.

In PD mode the replica's app gets

- a PdRole (pd_runs.py) under `PD_ROLE`: a prefill's rooms, or a decode's link to prefills;
- a middleware that answers the three generation routes (chat, completions, /generate) with their PD
  versions (pd_handlers.py), inside the server's frame middleware (auth, faults, error bodies);
- a cleanup context: a prefill starts its bootstrap server (pd_bootstrap.py) on `--host`:bootstrap port,
  reports the bound port (/server_info) and registers its rooms for decodes of this process
  (pd_rooms.LOCAL); a decode opens the HTTP session it reaches remote prefills with. At shutdown a
  prefill fails the rooms decodes still wait on.

`disaggregation_mode` null changes nothing. Every other route (health, info, loads, metrics) is the
ordinary one, PD-aware through the replica's PdStats (pd_stats.py): a PD server is healthy without a
peer, as SGLang's /health uses the fake transfer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from emulator import native_api, openai_api, pd_handlers
from emulator.config import EmulatorConfig
from emulator.pd_bootstrap import BootstrapServer
from emulator.pd_link import DecodeLink
from emulator.pd_rooms import LOCAL, PrefillRooms
from emulator.pd_runs import PD_ROLE, PdRole
from emulator.replica import REPLICA

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PD_HANDLERS: dict[Any, Handler] = {
    openai_api.chat_completions: pd_handlers.chat_completions,
    openai_api.completions: pd_handlers.completions,
    native_api.generate: pd_handlers.generate,
}


def prefill_info(cfg: EmulatorConfig) -> dict[str, Any]:
    """SGLang's PrefillServerInfo of this prefill (its bootstrap server's `GET /route`, every rank -1)."""
    return {
        "attn_tp_size": cfg.tp_size,
        "attn_cp_size": 1,
        "dp_size": cfg.dp_size,
        "pp_size": 1,
        "page_size": cfg.page_size,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "follow_bootstrap_room": cfg.pd.resolved_load_balance_method == "follow_bootstrap_room",
    }


def install(app: web.Application, cfg: EmulatorConfig) -> None:
    """Make the replica of `app` a PD prefill or decode (nothing in disaggregation_mode null)."""
    if not cfg.pd.enabled:
        return
    replica = app[REPLICA]
    prefill = cfg.pd.mode == "prefill"
    rooms = PrefillRooms(replica.pd, cfg.time_scale, prefill_info(cfg)) if prefill else None
    app[PD_ROLE] = PdRole(replica, rooms)
    app.middlewares.append(_dispatch)
    app.cleanup_ctx.append(_serving)


@web.middleware
async def _dispatch(request: web.Request, handler: Handler) -> web.StreamResponse:
    pd_handler = _PD_HANDLERS.get(request.match_info.handler)
    return await (pd_handler or handler)(request)


async def _serving(app: web.Application) -> AsyncIterator[None]:
    role = app[PD_ROLE]
    if role.rooms is not None:
        async for _ in _prefill(role, role.rooms):
            yield
        return
    async with aiohttp.ClientSession() as session:
        replica, cfg = role.replica, role.replica.cfg
        own = (cfg.page_size, cfg.kv_cache_dtype)
        role.link = DecodeLink(cfg.pd, own, replica.pd, session, lambda: replica.address, cfg.time_scale)
        yield


async def _prefill(role: PdRole, rooms: PrefillRooms) -> AsyncIterator[None]:
    cfg = role.replica.cfg
    server = BootstrapServer(rooms, cfg.host, cfg.bootstrap_port, cfg.tp_size)
    try:
        port = await server.start()
    except OSError as exc:
        raise OSError(f"--disaggregation-bootstrap-port {cfg.bootstrap_port}: {exc}") from exc
    role.replica.pd.bootstrap_port = port
    rooms.address = f"{cfg.host}:{port}"
    LOCAL[(cfg.host, port)] = rooms
    try:
        yield
    finally:
        LOCAL.pop((cfg.host, port), None)
        rooms.close()
        await server.close()
