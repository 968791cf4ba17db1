"""The real systems a simulated one stands for, how each is told of a fleet change, and what it measures.

| simulator system | real system | process |
|---|---|---|
| ``cost`` | kvroute's gateway, default policy | ``kvroute serve --policy cost`` |
| ``round_robin`` | kvroute's round robin | ``kvroute serve --policy round_robin`` |
| ``cache_aware`` | sglang-router (PyPI; the simulator models it) | ``launch_router --policy cache_aware`` |

Both start from ``bench.systems.registry``'s templates (the ones ``make bench`` uses), kvroute's with an
admin key (its admin API takes the fleet changes) and ``--public-status`` (the readiness check reads
/status). Fleet changes: kvroute ``POST /admin/replicas`` (add) and ``POST /admin/replicas/drain``
(remove: no new requests, the ones in flight finish, as the simulator drains); sglang-router ``POST
/workers`` (add) and ``DELETE /workers/<id>`` (remove; it has no drain, in-flight requests still finish).
A change a router refuses is recorded, not fatal: the report lists it.

``idle_while_queued_s`` reads kvroute's ``kvroute_replica_idle_while_queued_seconds_total`` from its
/metrics (summed over replicas, wall seconds); sglang-router has no such figure.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

import aiohttp

from bench.systems.registry import SGLANG_ENV, SGLANG_TEMPLATE, System, kvroute

ADMIN_KEY = "bench-confirm"
IDLE_METRIC = "kvroute_replica_idle_while_queued_seconds_total"
CALL_TIMEOUT_S = 10.0
REAL_NAMES = {
    "cost": "kvroute-cost",
    "round_robin": "kvroute-round_robin",
    "cache_aware": "sglang-cache_aware",
}
DEFAULT_REAL_SYSTEMS = ("cost", "cache_aware", "round_robin")


def real_system(name: str) -> System:
    """The process template of the real system standing for simulator system ``name``."""
    if name == "cache_aware":
        return System(REAL_NAMES[name], tuple(shlex.split(SGLANG_TEMPLATE % "cache_aware")), SGLANG_ENV)
    if name in REAL_NAMES:
        flags = ("--admin-key", ADMIN_KEY, "--public-status", "true")
        return dataclasses.replace(kvroute(name, *flags), name=REAL_NAMES[name])
    raise ValueError(f"no real system for {name!r}; known: {', '.join(REAL_NAMES)}")


@dataclass(frozen=True, slots=True)
class Membership:
    """How to tell the router at ``base`` that a replica joined or is leaving."""

    base: str
    kvroute: bool

    async def add(self, http: aiohttp.ClientSession, url: str) -> str:
        """'' when done, else what went wrong."""
        if self.kvroute:
            return await _call(http, "POST", self.base + "/admin/replicas", {"url": url})
        return await _call(http, "POST", self.base + "/workers", {"url": url})

    async def remove(self, http: aiohttp.ClientSession, url: str) -> str:
        if self.kvroute:
            return await _call(
                http, "POST", self.base + "/admin/replicas/drain", {"url": url, "draining": True}
            )
        worker = await _worker_id(http, self.base, url)
        return await _call(http, "DELETE", f"{self.base}/workers/{worker}", None)


async def _call(http: aiohttp.ClientSession, method: str, url: str, body: object) -> str:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
        async with http.request(method, url, json=body, headers=headers, timeout=timeout) as resp:
            return "" if resp.status < 300 else f"{method} {url}: {resp.status} {(await resp.text())[:120]}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{method} {url}: {type(exc).__name__}"


async def _worker_id(http: aiohttp.ClientSession, base: str, url: str) -> str:
    """sglang-router's id of the worker at ``url`` (its /workers list), else the URL itself."""
    try:
        async with http.get(base + "/workers") as resp:
            doc = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return url
    workers = doc.get("workers", []) if isinstance(doc, dict) else []
    for w in workers if isinstance(workers, list) else []:
        if isinstance(w, dict) and w.get("url") == url and w.get("id"):
            return str(w["id"])
    return url


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample of ``name`` in a Prometheus text exposition (None: no sample)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")]  # fmt: skip
    return sum(values) if values else None


async def idle_while_queued(http: aiohttp.ClientSession, base: str) -> float | None:
    """kvroute's idle-while-queued wall seconds, summed over replicas (None when not exported)."""
    try:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with http.get(base + "/metrics", headers=headers) as resp:
            text = await resp.text() if resp.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError):
        return None
    return metric_sum(text, IDLE_METRIC)
