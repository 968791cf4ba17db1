"""The emulated replica's aiohttp application: `build_app(cfg)` for one port, `serve(cfg)` for all.

Routes (SGLang 0.5.10 names, /v1/responses as 0.5.23; see info_api, openai_api, native_api,
responses_api for the shapes; an unknown path is FastAPI's 404 `{"detail": "Not Found"}`, a known path
with another method its 405 `{"detail": "Method Not Allowed"}`):

    POST /v1/chat/completions, /v1/completions, /generate (also PUT)
    POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel   (responses_api.py)
    GET  /v1/models, /v1/models/{model}, /health, /health_generate, /ready, /server_info,
         /get_server_info, /model_info, /get_model_info, /get_load, /v1/loads
    GET|POST /flush_cache   POST /abort_request   POST /tokenize /v1/tokenize /detokenize /v1/detokenize
    GET  /metrics                        only with --enable-metrics
    GET  /_emu/state, /_emu/requests[?path=P], POST /_emu/predict   only with --emu-debug
    GET|POST /_emu/faults                only with --emu-enable-faults

The engine runs as a task owned by a cleanup_ctx (which also opens and closes the KV-event publisher's
sockets with --kv-events-config, emulator/kv_events.py; /flush_cache publishes AllBlocksCleared).
Runners use handler_cancellation so that a client that goes away cancels its handler, which aborts the
request in the engine (as SGLang notices a dropped connection); an abort through /abort_request is
counted the same way (num_aborted_requests_total).

The frame middleware wraps every route: arrival time, the API key, the request log (--emu-debug, see
request_log.py), the connection-level faults (a reset before any byte on generation routes, failing
health probes, both for every request while a restart's down time lasts; see fault_hook.py) and SGLang's
flat 500 body for unexpected errors.

With --disaggregation-mode prefill|decode, pd_server.py makes the replica a PD server (its generation
routes, a prefill's bootstrap server, a decode's link to prefills).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from emulator import fault_hook, info_api, native_api, openai_api, openai_request, responses_api
from emulator.config import EmulatorConfig
from emulator.errors import ApiError, flat_error, json_response, native_error, read_json
from emulator.faults import FaultError
from emulator.pd_server import install as install_pd
from emulator.replica import ARRIVAL, REPLICA, Replica
from emulator.request_log import Entry, is_logged

_OPEN_PATHS = frozenset({"/health", "/health_generate", "/ready", "/metrics"})
_PROBE_PATHS = frozenset({"/health", "/health_generate", "/ready"})
_GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _frame(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[ARRIVAL] = asyncio.get_running_loop().time()
    replica = request.app[REPLICA]
    entry = await _record(request, replica)
    try:
        response = await _guarded(request, replica, handler, entry)
    except (asyncio.CancelledError, ConnectionResetError):  # the client left mid-answer
        _finish(entry, "cancelled")
        raise
    except web.HTTPException as exc:
        _finish(entry, "answered", exc.status)
        raise
    _finish(entry, "answered", response.status)
    return response


async def _record(request: web.Request, replica: Replica) -> Entry | None:
    if not (replica.cfg.emu_debug and is_logged(request.path)):
        return None
    try:
        body = await request.read()
    except web.HTTPException:  # too large: logged without a body, the handler answers
        body = b""
    return replica.requests.record(request.method, request.path, request.query_string, request.headers, body)


def _finish(entry: Entry | None, outcome: str, status: int | None = None) -> None:
    if entry is not None and entry.outcome == "pending":
        entry.outcome, entry.status = outcome, status


async def _guarded(
    request: web.Request, replica: Replica, handler: Handler, entry: Entry | None
) -> web.StreamResponse:
    """Auth, connection-level faults, then the route; unexpected errors become SGLang's flat 500."""
    key = replica.cfg.api_key
    open_path = request.path in _OPEN_PATHS or request.method == "OPTIONS"
    if key and not open_path and request.headers.get("Authorization") != f"Bearer {key}":
        return json_response({"error": "Unauthorized"}, 401)
    faults = replica.armed_faults
    if faults is not None:
        if request.path in _PROBE_PATHS and fault_hook.probe_fails(faults):
            return web.Response(status=503)
        if request.path in _GENERATION_PATHS and faults.take_reset(request[ARRIVAL]):
            _finish(entry, "reset")
            await fault_hook.reset(request)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)  # FastAPI's body
    except web.HTTPMethodNotAllowed as exc:
        allow = {"Allow": ", ".join(sorted(exc.allowed_methods))}
        return json_response({"detail": "Method Not Allowed"}, 405, allow)  # FastAPI's body
    except (web.HTTPException, ConnectionResetError):  # the latter: a write after the client left
        raise
    except Exception as exc:  # SGLang answers unexpected errors with its flat JSON, status 500
        traceback.print_exc()
        return flat_error(500, repr(exc), "InternalServerError")


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    replica = app[REPLICA]
    if replica.kv_events is not None:
        await replica.kv_events.start()
    task = asyncio.create_task(replica.engine.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if replica.kv_events is not None:
        await replica.kv_events.close()


async def flush_cache(request: web.Request) -> web.Response:
    if request.app[REPLICA].engine.flush():
        request.app[REPLICA].publish_kv_events()
        text = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"  # noqa: E501
        return web.Response(text=text)
    text = "Cache not flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"  # noqa: E501
    return web.Response(text=text, status=400)


async def abort_request(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    try:
        body = await read_json(request, require_json_type=False)
    except ApiError as err:
        return native_error(400, err.message)
    rid, everything = body.get("rid"), bool(body.get("abort_all"))
    replica.aborts.record(rid if isinstance(rid, str) else None)
    engine = replica.engine
    for ticket in [*engine.waiting, *engine.prefilling, *engine.decoding]:
        if (everything or ticket.work.rid == rid) and engine.abort(ticket, "Abort request by user."):
            replica.metrics.on_abort()  # as a dropped connection is counted
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    body = replica.metrics.render(replica.engine, replica.cfg.time_scale)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def emu_state(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    engine, live = replica.engine, replica.metrics.live
    queue = {
        "waiting": len(engine.waiting),
        "running": engine.running,
        "queued_prefill_tokens": engine.queued_prefill_tokens(),
        "predicted_queue_s": engine.queue_seconds(),
    }
    body = {
        "replica": replica.address,
        "queue": queue,
        "cache": dataclasses.asdict(engine.cache.stats()),
        "snapshot": engine.cache.snapshot(),
        "requests_total": live.requests_total,
        "prompt_tokens_total": live.prompt_tokens_total,
        "cached_tokens_total": live.cached_tokens_total,
        "arrival_lost_tokens_total": live.arrival_lost_tokens_total,
        "aborted_total": live.aborted_total,
        "abort_requests": replica.aborts.to_json(),
        "startup_time": replica.startup_time,
    }
    return json_response(body)


async def emu_requests(request: web.Request) -> web.Response:
    """The request log (request_log.py), optionally only one path: ?path=/v1/chat/completions."""
    return json_response(request.app[REPLICA].requests.to_json(request.query.get("path")))


async def emu_predict(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    try:
        body = await read_json(request, require_json_type=False)
        path, inner = body.get("path"), body.get("body")
        if not isinstance(inner, dict):
            raise ApiError("body must be an object")
        if path == "/v1/chat/completions":
            job = openai_request.parse_chat(inner, replica)[0][0]
        elif path == "/v1/completions":
            job = openai_request.parse_completion(inner, replica)[0][0]
        elif path == "/generate":
            job = native_api.parse_generate(inner, replica)
        else:
            raise ApiError(f"unknown path {path!r}")
    except ApiError as err:
        return native_error(err.status, err.message)
    p = replica.engine.predict(job.prompt, job.extra_key)
    return json_response(dataclasses.asdict(p))


async def emu_faults(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    if request.method == "POST":
        try:
            body = await read_json(request, require_json_type=False)
            now = asyncio.get_running_loop().time()
            action = replica.faults.arm(body, now, replica.cfg.time_scale)
        except (ApiError, FaultError) as err:
            return native_error(400, str(err))
        if action == "restart":
            replica.restart()
        replica.set_slow(replica.faults.slow_factor)
    return json_response(replica.faults.describe())


def build_app(cfg: EmulatorConfig) -> web.Application:
    """The application of the replica on cfg.ports[0]."""
    app = web.Application(middlewares=[_frame], client_max_size=64 * 1024**2)
    app[REPLICA] = Replica.build(cfg, cfg.ports[0])
    app.cleanup_ctx.append(_engine_ctx)
    r = app.router
    r.add_post("/v1/chat/completions", openai_api.chat_completions)
    r.add_post("/v1/completions", openai_api.completions)
    responses_api.register(app)
    r.add_route("POST", "/generate", native_api.generate)
    r.add_route("PUT", "/generate", native_api.generate)
    for path in ("/tokenize", "/v1/tokenize"):
        r.add_post(path, native_api.tokenize)
    for path in ("/detokenize", "/v1/detokenize"):
        r.add_post(path, native_api.detokenize)
    r.add_get("/v1/models", info_api.models)
    r.add_get("/v1/models/{model:.+}", info_api.model)
    for path in ("/health", "/health_generate"):
        r.add_get(path, info_api.health)
    r.add_get("/ready", info_api.ready)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, info_api.server_info)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, info_api.model_info)
    r.add_get("/get_load", info_api.get_load)
    r.add_get("/v1/loads", info_api.loads)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_route("POST", "/flush_cache", flush_cache)
    r.add_post("/abort_request", abort_request)
    if cfg.enable_metrics:
        r.add_get("/metrics", metrics)
    if cfg.emu_debug:
        r.add_get("/_emu/state", emu_state)
        r.add_get("/_emu/requests", emu_requests)
        r.add_post("/_emu/predict", emu_predict)
    if cfg.emu_enable_faults:
        r.add_get("/_emu/faults", emu_faults)
        r.add_post("/_emu/faults", emu_faults)
    install_pd(app, cfg)
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    return web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)


async def serve(cfg: EmulatorConfig, stop: asyncio.Event | None = None) -> None:
    """Serve every port of cfg until SIGINT/SIGTERM (or `stop`); prints one ready line per replica."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows event loops
            loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    try:
        for port in cfg.ports:
            runner = make_runner(build_app(cfg.with_port(port)))
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, cfg.host, port).start()
        for port in cfg.ports:
            print(f"kvroute-emulator ready http://{cfg.host}:{port}", flush=True)
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()
        sys.stdout.flush()
