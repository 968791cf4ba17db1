"""Timed fleet events during a replay: a workload's `outages` (bench/workloads/shapes.py, rag_restart).

An `Outage(at_frac, replica, down_s)` happens at modelled time

    at_s = first arrival + at_frac x arrival span          (bench.workloads.load.arrival_span)

so it stays at the same point of the workload when bench.workloads.load rescales the arrivals. `injector`
gives the replay (bench/runs/replay.py, `during`) a coroutine that, for every outage in time order, sleeps
until t0 + at_s x time scale (t0: the replay's start, where each request's own due time counts from) and
posts `{"action": "restart", "down_s": down_s}` to `POST /_emu/faults` of the replica at that index of
the fleet's URLs (the fleet runs with --emu-enable-faults, bench.point.prepare): the replica drops its
in-flight requests and GPU and host cache, resets every generation connection and fails its health
probes for `down_s` modelled seconds, then serves again. The same for every system, including client-rr
and the oracle, which go to the replicas directly. A post that fails raises: a run without its outage
would be reported as one with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import aiohttp

from bench.runs.replay import During
from bench.workloads.load import arrival_span
from bench.workloads.shapes import Outage, Workload

POST_TIMEOUT_S = 10.0


def schedule(workload: Workload) -> list[tuple[float, Outage]]:
    """(modelled seconds since the replay started, outage) for each outage, in time order."""
    if not workload.outages:
        return []
    first = min((r.arrival_s for r in workload.requests if r.after is None), default=0.0)
    span = arrival_span(workload)
    return sorted(((first + o.at_frac * span, o) for o in workload.outages), key=lambda x: x[0])


def describe(workload: Workload) -> list[dict[str, float | int]]:
    """The outages for a results file: when (modelled s), which replica (index), how long down."""
    return [{"at_s": round(at, 3), "replica": o.replica, "down_s": o.down_s} for at, o in schedule(workload)]


def injector(workload: Workload, replicas: Sequence[str], scale: float) -> During | None:
    """What to run during the replay of `workload` on the fleet `replicas` (None: it has no outages)."""
    planned = schedule(workload)
    if not planned:
        return None
    for _, o in planned:
        if not 0 <= o.replica < len(replicas):
            raise ValueError(f"outage of replica {o.replica}: the fleet has {len(replicas)}")

    async def run(session: aiohttp.ClientSession, t0: float) -> None:
        for at, outage in planned:
            await asyncio.sleep(max(0.0, t0 + at * scale - time.perf_counter()))
            await restart(session, replicas[outage.replica], outage.down_s)

    return run


async def restart(session: aiohttp.ClientSession, url: str, down_s: float) -> None:
    """Kill the emulated replica at `url` for `down_s` modelled seconds (its restart fault)."""
    body = {"action": "restart", "down_s": down_s}
    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
    try:
        async with session.post(url + "/_emu/faults", json=body, timeout=timeout) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url}/_emu/faults: HTTP {resp.status}: {(await resp.text())[:200]}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RuntimeError(f"{url}/_emu/faults: {type(exc).__name__}: {exc}") from exc
