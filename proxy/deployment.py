"""What holds per deployment however many gateway processes serve it: ``--workers`` and the shared limits.

- ``supervise``: ``kvroute serve --workers N`` (N > 1). The supervisor (``proxy/runtime/supervisor.py``)
  holds the port and runs N workers on it. Without ``--state`` (or with ``memory``) it also hosts the
  **local channel** (``proxy/sync/local_hub.py``) on a Unix socket in a fresh directory of mode 0700,
  and gives each worker ``--state kvroute+unix://<socket>``: the workers share the cache model's
  events, loads, learned rates, sessions and warm-up jobs (``proxy/sync/state_sync.py``, unchanged:
  the channel is one more ``StateStore``), the rate-limit buckets and, with ``--response-cache memory``,
  one response cache (bounded by its settings for all workers together) exactly as gateways sharing
  Redis do. With ``--state redis://...`` every worker uses that store and no channel runs.
- ``share``: in a gateway app with a shared store (Redis, or the channel) and client API keys, the
  rate limits become ``proxy.tenancy.shared_limits.SharedLimiter`` leasing from the store's buckets
  (a background sweep gives back unspent leases; all of them at shutdown); with the channel and
  ``--response-cache memory`` the response cache keeps its answers in the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Literal

from aiohttp import web

from proxy.answers.cache import RESPONSE_CACHE
from proxy.answers.store import MemoryStore
from proxy.config.settings import Settings
from proxy.context import GATEWAY
from proxy.runtime.supervisor import Supervisor, reserve_port
from proxy.sync.local_hub import Hub
from proxy.sync.local_store import LocalAnswers
from proxy.sync.local_wire import SCHEME, hub_url
from proxy.sync.redis_buckets import shared_buckets
from proxy.tenancy.shared_limits import LEASE_TTL_S, MemoryBuckets, SharedLimiter

SWEEP_S = LEASE_TTL_S / 2
STOP_WAIT_S = 2.0


def supervise(settings: Settings, argv: list[str]) -> int:
    """Runs the workers until a signal (or until they keep dying); the exit status."""
    try:
        held = reserve_port(settings.host, settings.port)
    except OSError as e:
        print(
            f"kvroute serve: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}",
            file=sys.stderr,
        )
        return 1
    home = tempfile.mkdtemp(prefix="kvroute-") if settings.state in (None, "memory") else None
    hub = os.path.join(home, "hub.sock") if home is not None else None
    extra = ["--workers", "1", "--port", str(held.getsockname()[1])]
    extra += ["--state", hub_url(hub)] if hub is not None else []
    command = [sys.executable, "-m", "proxy.cli", "serve", *argv, *extra]
    try:
        return asyncio.run(_supervise(settings, command, hub))
    finally:
        held.close()
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


async def _supervise(settings: Settings, command: list[str], path: str | None) -> int:
    hub = _hub(settings) if path is not None else None
    if hub is not None and path is not None:
        await hub.start(path)
    try:
        return await Supervisor(command, settings.workers, settings.drain_timeout).run(_announce)
    finally:
        if hub is not None:
            await hub.close()


def _hub(st: Settings) -> Hub:
    answers = None
    if st.response_cache == "memory":
        answers = MemoryStore(
            st.response_cache_ttl, st.response_cache_max_bytes, st.response_cache_max_entries
        )
    responses = MemoryStore(st.responses_ttl, st.responses_max_bytes, st.responses_max_entries)
    return Hub(MemoryBuckets(), answers, responses)


def _announce(url: str) -> None:
    print(f"kvroute ready {url} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}", flush=True)


def share(app: web.Application) -> None:
    """Shared rate limits and, on the local channel, the shared memory response cache (the docstring)."""
    gw = app[GATEWAY]
    st = gw.settings
    on_channel = st.state is not None and st.state.startswith(SCHEME + "://")
    cache = app.get(RESPONSE_CACHE)
    if on_channel and cache is not None and st.response_cache == "memory":
        cache.store = LocalAnswers(st.state or "", st.response_cache_max_bytes)
    buckets = shared_buckets(st.state, st.state_namespace) if gw.keys is not None else None
    if buckets is None:
        return
    when_down: Literal["open", "closed"] = "closed" if st.limits_when_store_down == "closed" else "open"
    limiter = gw.limiter = SharedLimiter(buckets, when_down)
    gw.metrics.register_section("limits", limiter.status)
    app.cleanup_ctx.append(_leases(limiter))


def _leases(limiter: SharedLimiter) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(_sweeping(limiter))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(limiter.sweep(all_=True), STOP_WAIT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(limiter.store.close(), STOP_WAIT_S)

    return ctx


async def _sweeping(limiter: SharedLimiter) -> None:
    while True:
        await asyncio.sleep(SWEEP_S)
        await limiter.sweep()
