"""Tenant isolation of prefix sharing, and the tenant's rate limits, for one parsed request.

A request whose API key has a tenant (``proxy/tenancy/keys.py``) gets the tenant's salt,
``kvroute-tenant-<first 32 hex digits of SHA-256(tenant)>:``, a fixed length:

- **in SGLang's KV namespace**: the body is rewritten (only then: otherwise the client's bytes go as
  sent) with ``cache_salt`` = salt + the client's ``cache_salt`` on the OpenAI routes (``/v1/responses``
  too), ``extra_key`` = salt + the client's ``extra_key`` on ``/generate`` (it has no ``cache_salt``;
  contract §8). SGLang's key is ``cache_salt + extra_key``, so every key of a tenant starts with its
  salt: two tenants never share a radix-tree prefix whatever they send, and a tenant that sends another
  tenant's salt only gets it after its own. On pass-through routes the fields are prefixed when present.
- **in routing**: ``Namespace.tenant`` and the salted fields go into the chain seed of the block hashes
  (``routing.canonical.namespace_salt``), so tenants never share routing state either; and into the
  response cache's tenant (``proxy.answers.cache.tenant_of``).

A request without a tenant may not use the reserved prefix in ``cache_salt + extra_key`` (400), so no
client can step into a tenant's namespace. A request's session key (``x-session-id`` or the configured
body field) is scoped to its client, ``ApiKey.bucket`` (the tenant, or the key's hash for a key without
one): two tenants that send the same session id are two sessions. Then the rate limits
(``proxy/tenancy/rate_limit.py``) are charged on an estimate and ``Charge.settle`` corrects them with the
reported usage.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import orjson
from aiohttp import web

from proxy.errors import InvalidRequest
from proxy.observe.access_log import Access
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.rate_limit import RateLimiter, estimate_tokens
from proxy.types import ParsedRequest, Route

TENANT_PREFIX = "kvroute-tenant-"
CLIENT_KEY: web.RequestKey[ApiKey] = web.RequestKey("kvroute_client_key", ApiKey)


def tenant_salt(tenant: str) -> str:
    return TENANT_PREFIX + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ":"


def _salted_fields(parsed: ParsedRequest) -> tuple[str, ...]:
    if parsed.route in (Route.CHAT, Route.COMPLETIONS, Route.RESPONSES):
        return ("cache_salt",)
    if parsed.route is Route.GENERATE:
        return ("extra_key",)
    return tuple(f for f in ("cache_salt", "extra_key") if f in parsed.body)


def _check_unreserved(parsed: ParsedRequest) -> None:
    body = parsed.body
    parts = [body.get(k) for k in ("cache_salt", "extra_key")]
    joined = "".join(p for p in parts if isinstance(p, str))
    if joined.startswith(TENANT_PREFIX):
        raise InvalidRequest(f"'cache_salt' may not start with {TENANT_PREFIX!r}", param="cache_salt")


def isolate(parsed: ParsedRequest, raw: bytes, tenant: str) -> tuple[ParsedRequest, bytes]:
    """The request in its tenant's namespace (body and routing); unchanged without a tenant."""
    if not tenant:
        _check_unreserved(parsed)
        return parsed, raw
    salt, body = tenant_salt(tenant), dict(parsed.body)
    fields = _salted_fields(parsed)
    if not fields:
        return parsed, raw  # a pass-through body without a namespace field (or not an object)
    for f in fields:
        given = body.get(f)
        if given is not None and not isinstance(given, str):
            raise InvalidRequest(f"'{f}' must be a string", param=f)
        body[f] = salt + (given or "")
    ns = parsed.routing.namespace
    ns = dataclasses.replace(
        ns,
        tenant=tenant,
        cache_salt=body.get("cache_salt", ns.cache_salt),
        extra_key=body.get("extra_key", ns.extra_key),
    )
    routing = dataclasses.replace(parsed.routing, namespace=ns)
    return dataclasses.replace(parsed, routing=routing, body=body), orjson.dumps(body)


@dataclass(slots=True)
class Charge:
    """A request's rate-limit charge, settled once its answer is over."""

    limiter: RateLimiter
    key: ApiKey
    estimated: int

    def settle(self, access: Access) -> None:
        used = [access.prompt_tokens, access.completion_tokens]
        actual = sum(u for u in used if u is not None) if access.prompt_tokens is not None else None
        self.limiter.settle(self.key, self.estimated, actual)


def scoped_session(parsed: ParsedRequest, key: ApiKey) -> ParsedRequest:
    """The request with its session key scoped to its client (``ApiKey.bucket``)."""
    session = parsed.routing.session
    if session is None:
        return parsed
    routing = dataclasses.replace(parsed.routing, session=f"{key.bucket}\x00{session}")
    return dataclasses.replace(parsed, routing=routing)


async def admit(
    request: web.Request, limiter: RateLimiter, parsed: ParsedRequest, raw: bytes
) -> tuple[ParsedRequest, bytes, Charge | None]:
    """Isolates the request in its key's tenant, scopes its session to the key's client and charges the
    key's limits (429 past them)."""
    key = request.get(CLIENT_KEY)
    parsed, raw = isolate(parsed, raw, key.tenant if key is not None else "")
    if key is None:
        return parsed, raw, None
    parsed = scoped_session(parsed, key)
    estimated = estimate_tokens(len(raw), parsed.routing.max_new_tokens)
    await limiter.charge(key, estimated)
    return parsed, raw, Charge(limiter, key, estimated)
