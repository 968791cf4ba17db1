"""The optional exact-response cache (``--response-cache memory|redis://...``; off by default).

A deterministic request answered once is answered again from the cache, without a replica.

Eligible (``bypass_reason`` is None): a chat or completions request (not ``/generate``, not pass-through)
- with an explicit ``temperature`` of 0, or an explicit integer ``seed`` (any temperature): an absent
  temperature means the engine's default, which samples;
- ``n`` absent or 1, and one completions prompt (not a batch of several);
- not asking ``return_cached_tokens_details`` (a question about a replica's KV cache) nor, when
  streamed, ``stream_options.continuous_usage_stats`` (usage on every chunk);
- without ``echo`` (the answer would repeat the prompt, and stores never hold prompt text);
- without ``Cache-Control: no-store`` (neither read nor write). ``no-cache`` skips the read and
  refreshes the entry with the new answer. Logprobs are deterministic too and are stored.

Key (``request_key``): the SHA-256 of the canonical JSON (``routing.canonical.canonical_json``: sorted
keys, compact) of the route, the model as resolved, the tenant and every body field but ``model``,
``stream``, ``stream_options``, ``user``, ``rid``, ``metadata``, ``store`` and ``priority`` (they change
how or for whom it is sent, not what is generated). The prompt is in that JSON in full, not in its
routing rendering (``routing.canonical.render``), which may merge requests that a chat template tells
apart: close is enough for predicting a KV prefix, an answer cache needs exact. The tenant
(``tenant_of``) is ``routing.canonical.namespace_salt`` (cache_salt + extra_key, the LoRA adapter, the
gateway tenant) plus the client: its API key's bucket (the tenant, or the key's hash for a key without
one) with ``--api-keys``, else the SHA-256 of the ``Authorization`` header it sent; two clients never
share an answer. Its first 16 hex digits name the tenant in store keys.

On a hit the client gets the stored answer (``proxy.answers.answer``: a new id and created, its own
``model``, usage with every prompt token cached), as a body or replayed as SSE; an entry without usage
(from a stream without ``include_usage``) cannot answer a request that needs usage and is a miss. Only
complete, successful single-choice answers are stored (``proxy.answers.capture``), after the miss has
been relayed. Every answer to an eligible request says ``x-kvroute-cache: hit`` or ``miss``, and
``bypass`` when not eligible or when Cache-Control turned reading off.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter

from proxy.answers.answer import Answer, hit_body, hit_stream, hit_usage
from proxy.answers.capture import Capture
from proxy.answers.store import MemoryStore, RedisStore, Store, store_key
from proxy.config.settings import Settings
from proxy.context import GATEWAY
from proxy.dispatch.forward import Tap, request_id
from proxy.observe.access_log import access_of
from proxy.observe.metrics import GatewayMetrics
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.namespace import CLIENT_KEY
from proxy.types import JSONObject, ParsedRequest, Route
from proxy.upstream.relay import end_body
from routing.canonical import canonical_json, namespace_salt

HEADER = "x-kvroute-cache"
NOT_IN_KEY = frozenset({"model", "stream", "stream_options", "user", "rid", "metadata", "store", "priority"})
_KEY_FORMAT = 1
Upstream = Callable[[Tap | None], Awaitable[web.StreamResponse]]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _is_batch(prompt: object) -> bool:
    return isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt)


def bypass_reason(route: Route, body: JSONObject, stream: bool) -> str | None:
    """Why a request is not cacheable, or None when it is (the rule of the module docstring)."""
    if route not in (Route.CHAT, Route.COMPLETIONS):
        return "route"
    temperature, seed = body.get("temperature"), body.get("seed")
    greedy = isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0
    if not greedy and not (isinstance(seed, int) and not isinstance(seed, bool)):
        return "sampling"
    if body.get("n") not in (None, 1) or (route is Route.COMPLETIONS and _is_batch(body.get("prompt"))):
        return "choices"
    if body.get("echo"):
        return "echo"
    options = body.get("stream_options")
    per_chunk = stream and isinstance(options, dict) and bool(options.get("continuous_usage_stats"))
    return "usage_details" if per_chunk or body.get("return_cached_tokens_details") else None


def client_of(request: web.Request) -> str:
    """Who asks: the API key's bucket, else the hash of the Authorization header sent (or "")."""
    key: ApiKey | None = request.get(CLIENT_KEY)
    if key is not None:
        return key.bucket
    authorization = request.headers.get("Authorization")
    return "auth:" + _sha256(authorization) if authorization else ""


def tenant_of(parsed: ParsedRequest, client: str) -> str:
    """The tenant's material: the KV namespace salt + the client (``client_of``)."""
    return namespace_salt(parsed.routing.namespace) + "\x00client=" + client


def request_key(parsed: ParsedRequest, tenant: str) -> str:
    rest = {k: v for k, v in parsed.body.items() if k not in NOT_IN_KEY}
    doc = {"v": _KEY_FORMAT, "route": parsed.route.value, "model": parsed.model, "tenant": tenant}
    return _sha256(canonical_json(doc | {"request": rest}))


def cache_control(request: web.Request) -> frozenset[str]:
    """The request's Cache-Control directive names, lower case."""
    values = request.headers.getall("Cache-Control", [])
    return frozenset(d.split("=")[0].strip().lower() for v in values for d in v.split(","))


@dataclass(frozen=True, slots=True)
class Plan:
    """What the cache does for one eligible request."""

    key: str  # the store key
    chat: bool
    read: bool
    stream: bool
    include_usage: bool
    model: str  # as the client sent it: a hit echoes it, as SGLang does

    @property
    def needs_usage(self) -> bool:
        return not self.stream or self.include_usage


def plan_for(request: web.Request, parsed: ParsedRequest) -> Plan | None:
    """The plan, or None when the cache is bypassed entirely (not eligible, or no-store)."""
    directives = cache_control(request)
    if "no-store" in directives or bypass_reason(parsed.route, parsed.body, parsed.stream) is not None:
        return None
    tenant = tenant_of(parsed, client_of(request))
    key = store_key(_sha256(tenant)[:16], request_key(parsed, tenant))
    options = parsed.body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    model = parsed.body.get("model")
    chat = parsed.route is Route.CHAT
    return Plan(key, chat, "no-cache" not in directives, parsed.stream, usage, str(model))


class ResponseCache:
    """Lookup, replay and store around ``forward``; one per gateway (``RESPONSE_CACHE``)."""

    def __init__(self, settings: Settings, store: Store, metrics: GatewayMetrics) -> None:
        self.settings, self.store = settings, store
        self.results = metrics.add(
            Counter("kvroute_response_cache", "Generation answers by cache result", ["result"], registry=None)
        )
        self.stored = metrics.add(Counter("kvroute_response_cache_stores", "Answers written", registry=None))

    async def serve(
        self, request: web.Request, parsed: ParsedRequest, upstream: Upstream
    ) -> web.StreamResponse:
        plan = plan_for(request, parsed)
        if plan is None:
            self._mark(request, "bypass")
            return await upstream(None)
        found = await self._get(plan) if plan.read else None
        if found is not None:
            self._mark(request, "hit")
            return await self._hit(request, plan, found)
        self._mark(request, "miss" if plan.read else "bypass")
        capture = Capture(plan.chat, self.settings.response_cache_max_bytes)
        resp = await upstream(capture)
        answer = capture.answer()
        if answer is not None and await self.store.put(plan.key, answer.to_json()):
            self.stored.inc()
        return resp

    def _mark(self, request: web.Request, result: str) -> None:
        request[CACHE_RESULT] = result
        self.results.labels(result).inc()

    async def _get(self, plan: Plan) -> Answer | None:
        data = await self.store.get(plan.key)
        answer = Answer.from_json(data) if data is not None else None
        if answer is None or answer.chat != plan.chat or (answer.usage is None and plan.needs_usage):
            return None
        return answer

    async def _hit(self, request: web.Request, plan: Plan, answer: Answer) -> web.StreamResponse:
        rid, created = uuid.uuid4().hex, int(time.time())
        headers = {"x-request-id": request_id(request)} if self.settings.request_id_headers else {}
        _account(request, answer)
        if not plan.stream:
            body = hit_body(answer, rid, created, plan.model)
            return web.Response(body=body, content_type="application/json", headers=headers)
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"} | headers
        )
        await out.prepare(request)
        await out.write(hit_stream(answer, rid, created, plan.model, plan.include_usage))
        await end_body(out)
        return out

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.store.close()


def _account(request: web.Request, answer: Answer) -> None:
    """The access log line of a hit: no replica, reason ``response_cache``, the hit's token counts."""
    access = access_of(request)
    access.reason = "response_cache"
    usage = hit_usage(answer.usage) or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    access.prompt_tokens = prompt if isinstance(prompt, int) else None
    access.cached_tokens = access.prompt_tokens
    access.completion_tokens = completion if isinstance(completion, int) else None


RESPONSE_CACHE: web.AppKey[ResponseCache] = web.AppKey("response_cache", ResponseCache)
CACHE_RESULT: web.RequestKey[str] = web.RequestKey("kvroute_response_cache", str)


def make_store(st: Settings) -> Store:
    if st.response_cache == "memory":
        return MemoryStore(st.response_cache_ttl, st.response_cache_max_bytes, st.response_cache_max_entries)
    return RedisStore(st.response_cache, st.response_cache_ttl, st.response_cache_max_bytes)


async def _header(request: web.Request, response: web.StreamResponse) -> None:
    result = request.get(CACHE_RESULT)
    if result is not None:
        response.headers[HEADER] = result


def install(app: web.Application) -> None:
    """Adds the cache to a gateway app when ``--response-cache`` is not ``off``."""
    st = app[GATEWAY].settings
    if st.response_cache == "off":
        return
    cache = ResponseCache(st, make_store(st), app[GATEWAY].metrics)
    app[RESPONSE_CACHE] = cache
    app.cleanup_ctx.append(cache.lifetime)
    app.on_response_prepare.append(_header)
