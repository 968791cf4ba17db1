"""What a URL is: one SGLang replica, or a kvroute gateway in front of a fleet, and each replica's pools.

Detection, in order:
1. ``GET /status`` answers a JSON object with ``policy`` and a ``replicas`` list: a kvroute gateway. Its
   healthy replicas' pools (``gpu_tokens``, ``host_tokens``, ``write_policy``, ``hybrid``, ``page_size``)
   come from that list; ``write_policy`` is null exactly when HiCache is off.
2. Otherwise ``GET /server_info`` (then its deprecated alias ``/get_server_info``) must answer SGLang's
   flat object (``max_total_num_tokens`` or ``internal_states``); ``/model_info`` (or
   ``/get_model_info``) tells whether the model is hybrid. The pools follow the contract's §4 recipe
   (``proxy.fleet.replica_info``, the gateway's own parser): GPU = ``internal_states[0].memory_usage.
   token_capacity`` else ``max_total_num_tokens``; host = ``hicache_size`` GB / bytes per token, or
   ``ceil_page(gpu x hicache_ratio) + page``.
Anything else is "not an SGLang server or a kvroute gateway"; a refused connection is "unreachable", and
HTTP 401/403 asks for ``--api-key``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diag.client import DiagError, SGLangClient, Unauthorized, Unreachable
from proxy.fleet.replica_info import parse_replica_info


@dataclass(frozen=True, slots=True)
class Pool:
    """One replica's KV pools in tokens (per TP rank) and the settings that decide host reuse."""

    replica: str
    gpu_tokens: int
    host_tokens: int
    write_policy: str | None  # None: HiCache off
    hybrid: bool
    page_size: int = 1
    max_input_tokens: int | None = None  # max_req_input_len, when the replica reports it

    @property
    def hicache(self) -> bool:
        return self.write_policy is not None

    def describe(self) -> str:
        cache = f"HiCache {self.write_policy}" if self.hicache else "HiCache off"
        model = ", hybrid model" if self.hybrid else ""
        host = f", host pool {self.host_tokens:,} tokens" if self.hicache else ""
        return f"{cache}{model}, GPU pool {self.gpu_tokens:,} tokens{host}"


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    gateway: bool
    pools: tuple[Pool, ...]  # the healthy replicas (one for a plain SGLang server)
    version: str | None = None

    def pool(self, replica: str | None) -> Pool:
        """The pool of ``replica`` (a gateway's x-kvroute-replica value); the only one otherwise."""
        for p in self.pools:
            if p.replica == replica:
                return p
        if self.gateway and replica is not None:
            raise DiagError(f"the gateway answered from replica {replica}, which /status does not list")
        return self.pools[0]

    def describe(self) -> str:
        """One line for a replica; for a gateway, one more line per healthy replica."""
        if self.gateway:
            head = f"kvroute gateway {self.url}, {len(self.pools)} healthy replica(s)"
            return "\n".join([head, *(f"  replica {p.replica}: {p.describe()}" for p in self.pools)])
        return f"SGLang {self.version or '?'} at {self.url}: {self.pools[0].describe()}"


def _num(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def gateway_pools(status: Mapping[str, Any]) -> tuple[Pool, ...]:
    pools = []
    for r in status.get("replicas") or []:
        if not isinstance(r, dict) or not r.get("healthy") or not isinstance(r.get("id"), str):
            continue
        policy = r.get("write_policy")
        pools.append(
            Pool(
                replica=r["id"],
                gpu_tokens=_num(r, "gpu_tokens"),
                host_tokens=_num(r, "host_tokens"),
                write_policy=policy if isinstance(policy, str) else None,
                hybrid=bool(r.get("hybrid")),
                page_size=max(1, _num(r, "page_size")),
            )
        )
    return tuple(pools)


def replica_pool(url: str, info: Mapping[str, Any], model_info: Mapping[str, Any]) -> Pool:
    parsed = parse_replica_info(info, model_info)
    max_input = _num(info, "max_req_input_len")
    return Pool(
        replica=url,
        gpu_tokens=parsed.gpu_tokens,
        host_tokens=parsed.host_tokens,
        write_policy=parsed.write_policy,
        hybrid=parsed.hybrid,
        page_size=parsed.page_size,
        max_input_tokens=max_input or None,
    )


async def _optional_json(client: SGLangClient, *paths: str) -> Any:
    """The first of ``paths`` that answers JSON; None if none does (connection errors propagate)."""
    for path in paths:
        try:
            doc = await client.get_json(path)
        except (Unreachable, Unauthorized):
            raise
        except DiagError:
            continue
        if doc is not None:
            return doc
    return None


def _is_gateway(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("replicas"), list) and "policy" in doc


def _is_sglang(doc: Any) -> bool:
    return isinstance(doc, dict) and ("max_total_num_tokens" in doc or "internal_states" in doc)


async def discover(client: SGLangClient) -> Target:
    """Detects what ``client.url`` is and reads its pools; raises DiagError with a one-line reason."""
    status = await _optional_json(client, "/status")
    if _is_gateway(status):
        pools = gateway_pools(status)
        if not pools:
            raise DiagError(f"the kvroute gateway at {client.url} has no healthy replica")
        return Target(client.url, True, pools)
    info = await _optional_json(client, "/server_info", "/get_server_info")
    if not _is_sglang(info):
        raise DiagError(
            f"{client.url} does not look like an SGLang server or a kvroute gateway "
            "(no SGLang /server_info, no kvroute /status)"
        )
    model_info = await _optional_json(client, "/model_info", "/get_model_info")
    pool = replica_pool(client.url, info, model_info if isinstance(model_info, dict) else {})
    version = info.get("version")
    return Target(client.url, False, (pool,), version if isinstance(version, str) else None)
