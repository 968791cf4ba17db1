"""``kvroute serve``: the aiohttp application and its entry point.

``build_app(settings)`` wires the gateway: one ``Gateway`` value under ``GATEWAY``; one cleanup_ctx
per long-lived resource (the shared upstream ClientSession, the health poller, background tasks, and
with ``--discover`` the DNS discovery task, its ``Discovery`` under ``DISCOVERY``; the KV-event
subscriptions, ``proxy/sync/kv_subscriber.py``);
routes for the OpenAI surface (the Responses and Conversations APIs from ``proxy/responses``), SGLang's
``/generate``, pass-through of other ``/v1/*`` paths, the admin
API and the operational endpoints (``proxy/front/operations.py``); two middlewares, the errors one outside
and ``proxy/front/gatekeeper.py`` (client API keys, admission) inside. Serve it with
``proxy.runtime.serving.runner`` (``main`` does, and the tests): handler cancellation, so a client that
disconnects cancels its handler at once and the upstream request is aborted, and OpenAI-shaped answers to
malformed HTTP. ``main`` returns ``serve``'s exit status (0 after a drain, 1 when a second signal cut it
short).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial

from aiohttp import web

from proxy import deployment
from proxy.admin import control, preview, replicas
from proxy.answers import cache as response_cache
from proxy.config.settings import Settings, SettingsError, load_settings
from proxy.context import GATEWAY, Gateway
from proxy.disagg.pairs import PairDispatch
from proxy.dispatch.forward import PAIRS
from proxy.exact.tokenizer import PromptTokenizer
from proxy.fleet.discovery import DISCOVERY, discovery_for
from proxy.fleet.fleet import Fleet
from proxy.fleet.restarts import Restarts
from proxy.front import gatekeeper, handlers, operations, passthrough, request_guard
from proxy.front.request_body import body_middleware
from proxy.observe.metrics import GatewayMetrics
from proxy.responses import routes as responses
from proxy.runtime.malloc import tune_malloc
from proxy.runtime.serving import StartupError, serve, tls_context
from proxy.runtime.supervisor import WORKER_ENV
from proxy.status.observers import observe_ctx, observe_tokenizer
from proxy.sync import state_sync
from proxy.sync.kv_subscriber import kv_events_ctx
from proxy.types import Route
from proxy.upstream.breaker import BreakerPolicy
from proxy.upstream.client import Upstream
from proxy.upstream.credentials import ReplicaAuth
from proxy.warm import api as warm_api
from routing.router import Router

log = logging.getLogger("kvroute")


def build_gateway(settings: Settings) -> Gateway:
    router = Router(settings.routing)
    fleet = Fleet(
        settings.backends,
        settings.health_interval,
        on_removed=router.forget,
        restarts=Restarts(router.restart, router.kv_reset, lambda r: router.kv_mode(r).mode == "exact"),
        breaker=BreakerPolicy.of(settings),
        pricing=lambda replica: 1.0 / router.rates.get(replica).prefill_tokens_per_s,
        auth=ReplicaAuth(settings.replica_api_key),
    )
    for i, url in enumerate(settings.prefill):
        fleet.add(url, "prefill", settings.bootstrap_port_of(i))
    for url in settings.decode:
        fleet.add(url, "decode")
    metrics = GatewayMetrics(
        lambda: [(r.id, r.inflight_requests, r.healthy and r.info is not None) for r in fleet.replicas()],
        router.accuracy,
    )
    tokenizer = PromptTokenizer.load(settings.tokenizer_path) if settings.tokenizer_path else None
    observe_tokenizer(metrics, tokenizer)
    return Gateway(settings=settings, fleet=fleet, router=router, metrics=metrics, tokenizer=tokenizer)


def _late(gw: Gateway) -> Callable[[str], None]:
    """What a first-byte wait kept past its deadline on a working replica tells
    (proxy/upstream/liveness.py)."""
    extended = gw.metrics.first_byte_waits_extended

    def late(replica: str) -> None:
        extended.labels(replica).inc()
        log.info("replica %s: no first byte by the deadline, but the replica is working: waiting on", replica)

    return late


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    session = Upstream.new_session()
    st = gw.settings
    gw.upstream = Upstream(session, st.connect_timeout, gw.liveness, _late(gw), gw.fleet.auth.authorization)
    try:
        yield
    finally:
        await gw.background.close()
        await session.close()
        gw.upstream = None


async def _poller_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    await gw.fleet.check_all(gw.up)  # replicas are known before the first request is served
    task = asyncio.get_running_loop().create_task(gw.fleet.run(gw.up))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _discovery_ctx(app: web.Application) -> AsyncIterator[None]:
    gw, discovery = app[GATEWAY], app[DISCOVERY]
    await discovery.refresh(gw.up)  # the first answer (bounded by the lookup time-out) before serving
    task = asyncio.get_running_loop().create_task(discovery.run(gw.up))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def build_app(settings: Settings) -> web.Application:
    guard = request_guard.request_guard
    middlewares = [handlers.errors_middleware, guard, gatekeeper.gatekeeper, body_middleware]
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[GATEWAY] = build_gateway(settings)
    app[PAIRS] = PairDispatch(app[GATEWAY])  # prefill/decode pairs (proxy/disagg)
    response_cache.install(app)
    app.cleanup_ctx.append(_session_ctx)
    app.cleanup_ctx.append(_poller_ctx)
    if settings.discover:
        app[DISCOVERY] = discovery_for(settings, app[GATEWAY].fleet)
        app.cleanup_ctx.append(_discovery_ctx)
    app.cleanup_ctx.append(observe_ctx)
    app.cleanup_ctx.append(kv_events_ctx)
    r = app.router
    r.add_route("*", "/v1/chat/completions", handlers.generation(Route.CHAT))
    r.add_route("*", "/v1/completions", handlers.generation(Route.COMPLETIONS))
    r.add_route("*", "/generate", handlers.generation(Route.GENERATE, ("POST", "PUT")))
    state_sync.add_to(app)
    deployment.share(app)
    operations.add_routes(app)
    warm_api.add_routes(app)
    responses.add_routes(app)  # the Responses and Conversations APIs, their state (proxy/responses)
    r.add_route("*", "/v1/{tail:.*}", passthrough.passthrough)
    replicas.add_routes(app)
    control.add_routes(app)
    preview.add_routes(app)
    return app


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str]) -> int:
    worker = WORKER_ENV in os.environ
    try:
        settings = load_settings(argv)
        app = build_app(settings) if worker or settings.workers == 1 else None
    except (SettingsError, ValueError) as e:
        print(f"kvroute serve: {e}", file=sys.stderr)
        return 2
    if not (settings.backends or settings.prefill) and not settings.discover and settings.admin_key is None:
        print(
            "kvroute serve: nothing to route to: give replicas with --backend URL [URL ...], "
            "prefill/decode servers with --prefill URL --decode URL, --discover dns://NAME:PORT, "
            "or --admin-key K to add them later with POST /admin/replicas",
            file=sys.stderr,
        )
        return 2
    who = f"[worker {os.environ[WORKER_ENV]}]" if worker else ""
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s"
    )
    log.info("settings: %s", json.dumps(settings.redacted(), default=str))
    if not (settings.backends or settings.prefill) and not settings.discover:
        log.warning("no --backend given: add replicas with POST /admin/replicas (the admin key)")
    if app is None:
        return deployment.supervise(settings, argv)
    _install_uvloop()
    tune_malloc()
    try:
        tls = (
            tls_context(settings.tls_cert, settings.tls_key)
            if settings.tls_cert and settings.tls_key
            else None
        )
        st = settings
        awaited = partial(operations.awaited, app)
        return asyncio.run(
            serve(app, st.host, st.port, st.drain_timeout, tls, st.client_idle_timeout, awaited, worker)
        )
    except StartupError as e:
        print(f"kvroute serve: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
