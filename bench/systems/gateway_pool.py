"""Several kvroute gateways in front of one fleet, sharing routing state through one Redis, and the
client's round robin over them.

`GatewayPool(n, backends, logs, state)` starts n `kvroute serve --policy cost` processes from
bench.systems.registry' kvroute template (`system_process`: each on its own free loopback port, ready when its
/status counts every replica healthy), with `--state URL --state-namespace NS` when `state` is given (one
Redis, one namespace: one fleet of gateways); with n = 1 and no state it is the single gateway alone.

`choose` is the client-side round robin (a `bench.runs.replay.Chooser`, as `bench.runs.replay.rotating`) over
the gateways that are up; every pick is logged as a `Send`. `restart(i)` is a rolling
restart of gateway i the way a load balancer sees one: i leaves the rotation (its turns go to the
others, so the client never waits), gets SIGTERM through its ManagedProcess and drains (kvroute stops
listening, finishes the requests it has in flight and exits; SIGKILL only after DRAIN_S), is started
again on the same port, is ready when its /status
counts every replica healthy (the same check as at the start) and its /ready answers 200 (with
``--state``, once its start-up replay of the shared log is done), then its /status `state` section is read
once (how many events it had replayed from Redis at that moment) and it rejoins the rotation.

`preview` (a `bench.runs.replay.Before`, with `previews=True`) asks EVERY gateway that is up, at the same
moment and just before the request is sent, where it would route it (kvroute's `POST /admin/route/<path>`,
which decides and records nothing; the gateways run with an admin key for it) and keeps the answers by
request index in `previews` (one replica id per gateway asked; "" for a gateway that did not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Self

import aiohttp

from bench.systems.procs import ManagedProcess, ProcessGroup, free_ports, replica_id
from bench.systems.registry import kvroute, system_process
from bench.workloads.generators import TimedRequest

DRAIN_S = 30.0  # SIGTERM, then SIGKILL after this (Kubernetes' default terminationGracePeriodSeconds)
ADMIN_KEY = "bench-gateways"  # the route previews are an admin endpoint
PREVIEW_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class StateStore:
    url: str
    namespace: str


class Send(NamedTuple):
    """One pick of the client's round robin: the request of index `request` went to `gateway` (0-based)
    while that gateway was in its `generation`-th life (0 until it is restarted)."""

    request: int
    gateway: int
    generation: int


@dataclass(frozen=True, slots=True)
class Restart:
    gateway: int
    stop_s: float  # wall seconds from SIGTERM until it exited
    down_s: float  # wall seconds out of the rotation (stop + start + ready)
    state: dict[str, Any]  # its /status "state" section when it was declared ready again


class GatewayPool(ProcessGroup):
    """n kvroute gateways and the client's round robin over those that are up (module docstring)."""

    def __init__(self, n: int, backends: Sequence[str], logs: Path, state: StateStore | None = None) -> None:
        super().__init__()
        flags = ("--state", state.url, "--state-namespace", state.namespace) if state else ()
        # /status stays open: the bench's own readiness checks read it, on loopback
        self._system = kvroute("cost", *flags, "--admin-key", ADMIN_KEY, "--public-status", "true")
        self._backends = list(backends)
        self._logs = logs
        self.ports = free_ports(n)
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self._up = [False] * n
        self._generation = [0] * n
        self._turn = 0
        self.sends: list[Send] = []
        self.restarts: list[Restart] = []
        self.previews: dict[int, tuple[str, ...]] = {}

    def _process(self, i: int) -> ManagedProcess:
        log = self._logs / f"gateway-{i}.{self._generation[i]}.log"
        return system_process(self._system, self._backends, log, self.ports[i])

    async def __aenter__(self) -> Self:
        try:
            for i in range(len(self.ports)):
                self._procs.append(await self._process(i).__aenter__())
                self._up[i] = True
        except BaseException:
            await self.close()
            raise
        return self

    def choose(self, req: TimedRequest) -> str:
        """The next gateway in turn that is up (round robin); logs the pick."""
        n = len(self.urls)
        for _ in range(n):
            i, self._turn = self._turn % n, self._turn + 1
            if self._up[i]:
                break
        self.sends.append(Send(req.index, i, self._generation[i]))
        return self.urls[i]

    async def preview(
        self, http: aiohttp.ClientSession, req: TimedRequest, body: bytes, sticky: bool
    ) -> None:
        """Every gateway that is up says where it would send `req` now (module docstring)."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"}
        if sticky:
            headers["x-session-id"] = req.session
        urls = [u for u, up in zip(self.urls, self._up, strict=True) if up]
        path = "/admin/route" + req.path  # e.g. /admin/route/v1/chat/completions
        found = await asyncio.gather(*(_previewed(http, u + path, body, headers) for u in urls))
        self.previews[req.index] = tuple(found)

    async def restart(self, i: int) -> Restart:
        """Gateway i out of the rotation, stopped, started again on its port, back in (docstring)."""
        t0 = time.monotonic()
        self._up[i] = False
        await asyncio.to_thread(self._procs[i].stop, DRAIN_S)
        await asyncio.to_thread(self._procs[i].close)
        stopped = time.monotonic() - t0
        self._generation[i] += 1
        self._procs[i] = await self._process(i).__aenter__()
        await until_ready(self.urls[i])
        state = await state_section(self.urls[i])
        self._up[i] = True
        done = Restart(i, stopped, time.monotonic() - t0, state)
        self.restarts.append(done)
        return done


async def _previewed(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> str:
    """The replica a gateway's route preview names ("" when it did not answer)."""
    try:
        timeout = aiohttp.ClientTimeout(total=PREVIEW_TIMEOUT_S)
        async with http.post(url, data=body, headers=headers, timeout=timeout) as resp:
            doc = await resp.json() if resp.status == 200 else {}
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return ""
    replica = doc.get("replica") if isinstance(doc, dict) else None
    return replica_id(replica) if isinstance(replica, str) else ""


async def until_ready(url: str, within_s: float = 10.0) -> bool:
    """Polls the gateway's /ready (200 once its replicas are healthy and, with --state, its start-up
    replay of the shared log is done) every 50 ms for at most ``within_s``."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                async with http.get(f"{url}/ready") as resp:
                    if resp.status == 200:
                        return True
            await asyncio.sleep(0.05)
    return False


async def state_section(url: str) -> dict[str, Any]:
    """The gateway's /status `state` section ({} when it has none or does not answer)."""
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/status") as resp:
            doc = await resp.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return {}
    state = doc.get("state") if isinstance(doc, dict) else None
    return state if isinstance(state, dict) else {}
