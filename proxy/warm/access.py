"""Who may warm what: the caller of a warm-up request, the tenant its documents are warmed for, its
quota, and which jobs it may see.

- **The admin key** may warm for no tenant, or for a named ``tenant`` (one of ``--api-keys``' tenants:
  another name is a 400); it sees and deletes every job.
- **A client key** (``--api-keys``) warms into its own namespace: its tenant's, or for a key without a
  tenant the shared tenant-less one. It may not name another tenant (403). Each job is charged to the
  key's rate limits like a request (one request, the documents' estimated tokens: 429 past them), and
  the live warmed tokens of its owner (``ApiKey.bucket``) stay under ``--warmup-max-tokens-per-tenant``
  (429 ``warmup_quota_exceeded`` beyond: delete a job or let one expire). It sees and deletes only the
  jobs of its owner; another owner's job id is the same 404 as an unknown one.
- **No key** works only on a gateway with neither an admin key nor client keys (an open gateway),
  as the admin would.

A job's owner is the bucket of the tenant it warms for (``tenant:NAME``), the client key's bucket, or
``""`` for the admin's tenant-less jobs (visible to the admin only). Owners are published with the
jobs' views to other gateways (``proxy.warm.api.WarmupsPart``): they name tenants and key-hash prefixes,
never keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.context import Gateway
from proxy.errors import Forbidden, InvalidRequest, RateLimited, Unauthorized
from proxy.tenancy.admin_key import is_admin
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.namespace import CLIENT_KEY
from proxy.tenancy.rate_limit import estimate_tokens
from proxy.warm.registry import Job


class QuotaExceeded(RateLimited):
    code = "warmup_quota_exceeded"


@dataclass(frozen=True, slots=True)
class WarmCaller:
    admin: bool
    key: ApiKey | None  # the client key, when a client key called

    def owner_for(self, tenant: str) -> str:
        """The owner of a job this caller submits for ``tenant``."""
        if tenant:
            return f"tenant:{tenant}"
        return self.key.bucket if self.key is not None else ""

    def may_see(self, owner: str) -> bool:
        return self.admin or (self.key is not None and owner == self.key.bucket)


def caller(request: web.Request, gw: Gateway) -> WarmCaller:
    """Who calls (module docstring); 401 when the gateway needs a key and none fits."""
    if is_admin(request, gw.settings):
        return WarmCaller(True, None)
    key: ApiKey | None = request.get(CLIENT_KEY)
    if key is not None:
        return WarmCaller(False, key)
    if gw.settings.admin_key is None and gw.keys is None:
        return WarmCaller(True, None)
    raise Unauthorized("warm-ups need the admin key or a client API key: send Authorization: Bearer <key>")


def tenant_for(who: WarmCaller, gw: Gateway, body: dict[str, Any]) -> str:
    """The tenant the documents are warmed for: a client key's own; the admin's ``tenant`` field."""
    asked = body.get("tenant")
    if asked is not None and (not isinstance(asked, str) or not asked):
        raise InvalidRequest("'tenant' must be a non-empty string", param="tenant")
    if who.key is not None:
        if asked is not None and asked != who.key.tenant:
            raise Forbidden("a client key warms its own tenant's documents only", param="tenant")
        return who.key.tenant
    if asked is not None and (gw.keys is None or asked not in gw.keys.tenant_names()):
        raise InvalidRequest(f"no tenant {asked!r} in this gateway's --api-keys", param="tenant")
    return asked or ""


async def charge(who: WarmCaller, gw: Gateway, size_bytes: int) -> None:
    """One request and the documents' estimated tokens against the client key's limits (429)."""
    if who.key is not None:
        await gw.limiter.charge(who.key, estimate_tokens(size_bytes, 0))


def check_quota(gw: Gateway, held: int, job: Job, owner: str) -> None:
    """429 when ``owner``'s live warmed tokens (``held`` before this job) would pass the bound."""
    bound = gw.settings.warmup_max_tokens_per_tenant
    tokens = sum(d.tokens for d in job.docs)
    if owner and bound and held + tokens > bound:
        raise QuotaExceeded(
            f"this job's {tokens} tokens would bring the warmed documents of {owner} to "
            f"{held + tokens}, over the bound of {bound} (warmup_max_tokens_per_tenant): "
            "delete a job or wait for one to expire",
            retry_after=60,
        )
