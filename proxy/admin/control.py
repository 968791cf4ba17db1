"""Replica control through the gateway's admin API: the only way a replica control endpoint is reached.

    POST /admin/control/{action}   {"url"?: U, "body"?: {...}, "timeout"?: S}
                                   → 200 {"action", "replicas": {U: {"status", "answer"}}} when every
                                     replica answered 2xx, else 502 with the same document
    POST /flush_cache[?timeout=S]  the ``flush_cache`` action on every healthy replica (as sglang-router),
                                   SGLang's ``timeout`` query forwarded → 200 {"flushed": true,
                                   "replicas": {U: status}} when every one flushed, else 502

Both need the admin key (``proxy/admin/replicas.py``). ``url`` names one replica (by its id or URL); without
it the action goes to every healthy replica. ``body`` is the JSON the replica's endpoint takes (SGLang's
fields, sglang-contract §1.1), sent as given. The gateway then tells the router what the action did to
the replica's cache: a flush, a weight update or a release of KV memory empties its radix tree and host
pool, so its cache model restarts (``Router.restart``); the other actions leave it as it was. A client
never reaches these endpoints: the pass-through forwards only its allowlist (``proxy/front/passthrough.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import InvalidRequest, NotFound, UpstreamError
from proxy.front.openai import parse_json
from proxy.tenancy.admin_key import authorize

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 600.0
ANSWER_CHARS = 1000  # of each replica's answer, in the admin API's reply


@dataclass(frozen=True, slots=True)
class Action:
    path: str
    resets_cache: bool  # the replica's radix tree and host pool are emptied when it succeeds
    why: str


ACTIONS: dict[str, Action] = {
    "flush_cache": Action("/flush_cache", True, "empty the radix tree and the host pool"),
    "abort_request": Action("/abort_request", False, "abort a request by rid, or all"),
    "start_profile": Action("/start_profile", False, "start the torch profiler"),
    "stop_profile": Action("/stop_profile", False, "stop the torch profiler"),
    "pause_generation": Action("/pause_generation", False, "pause the scheduler"),
    "continue_generation": Action("/continue_generation", False, "resume the scheduler"),
    "update_weights_from_disk": Action("/update_weights_from_disk", True, "load new weights"),
    "load_lora_adapter": Action("/load_lora_adapter", False, "load a LoRA adapter"),
    "unload_lora_adapter": Action("/unload_lora_adapter", False, "unload a LoRA adapter"),
    "release_memory_occupation": Action("/release_memory_occupation", True, "free GPU memory"),
    "resume_memory_occupation": Action("/resume_memory_occupation", False, "take GPU memory back"),
}


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


def _timeout(value: object) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        t = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else -1.0
    except ValueError:
        t = -1.0
    if not 0 < t <= MAX_TIMEOUT_S:
        raise InvalidRequest(f"'timeout' must be seconds in (0, {MAX_TIMEOUT_S:g}]", param="timeout")
    return t


def _targets(gw: Gateway, url: object) -> list[str]:
    if url is None:
        return [s.id for s in gw.fleet.snapshot(None) if s.healthy]
    replica = gw.fleet.get(url) if isinstance(url, str) else None
    if replica is None:
        raise NotFound(f"no replica {url!r}", param="url")
    return [replica.id]


async def run_action(
    gw: Gateway, action: Action, targets: list[str], body: Any, timeout_s: float, query: str = ""
) -> dict[str, dict[str, Any]]:
    """The action on every target at once, per replica its status and answer; the router is told of
    the caches it emptied."""

    async def one(replica: str) -> tuple[str, dict[str, Any]]:
        try:
            status, answer = await gw.up.call(replica, "POST", action.path + query, timeout_s, json=body)
        except UpstreamError as e:
            return replica, {"status": 502, "answer": e.message}
        if 200 <= status < 300 and action.resets_cache:
            gw.router.restart(replica)
        return replica, {"status": status, "answer": answer.decode(errors="replace")[:ANSWER_CHARS]}

    return dict(await asyncio.gather(*(one(r) for r in targets)))


def _all_ok(results: dict[str, dict[str, Any]]) -> bool:
    return bool(results) and all(200 <= r["status"] < 300 for r in results.values())


async def control(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    name = request.match_info["action"]
    action = ACTIONS.get(name)
    if action is None:
        raise NotFound(f"no replica action {name!r} (known: {', '.join(ACTIONS)})")
    doc = parse_json(await request.read()) if request.body_exists else {}
    unknown = sorted(set(doc) - {"url", "body", "timeout"})
    if unknown:
        raise InvalidRequest(f"unknown fields {unknown}", param=unknown[0])
    body = doc.get("body", {})
    if not isinstance(body, dict):
        raise InvalidRequest("'body' must be a JSON object", param="body")
    targets, wait = _targets(gw, doc.get("url")), _timeout(doc.get("timeout"))
    results = await run_action(gw, action, targets, body, wait)
    return _json({"action": name, "replicas": results}, status=200 if _all_ok(results) else 502)


async def flush_cache(request: web.Request) -> web.Response:
    """``POST /flush_cache``: every healthy replica flushed, SGLang's ``timeout`` query forwarded."""
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    given = request.query.get("timeout")
    timeout = _timeout(given) if given is not None else None
    query = f"?timeout={timeout:g}" if timeout is not None else ""
    wait = DEFAULT_TIMEOUT_S + (timeout or 0.0)
    results = await run_action(gw, ACTIONS["flush_cache"], _targets(gw, None), None, wait, query)
    doc = {"flushed": _all_ok(results), "replicas": {r: v["status"] for r, v in results.items()}}
    return _json(doc, status=200 if doc["flushed"] else 502)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/admin/control/{action}", control)
    app.router.add_post("/flush_cache", flush_cache)
