"""The scenario generator: a fleet and a workload drawn from one seed, and the two fixed seed sets.

``draw(seed)`` (``random.Random`` seeded with the text ``kvroute-sim:<seed>``, so the same seed gives the
same scenario on every machine and Python run):

1. the fleet (``bench.sim.fleets``): 2-16 replicas, speeds, GPU and host pools, HiCache, joins and
   removals mid-run;
2. the workload: one to four components (``bench.sim.components``: Zipf-popular RAG documents, agent
   or coding sessions, a cold document turning hot, short chat) sharing ``TARGET_REQUESTS`` requests on a
   nominal timeline, sized against the fleet (documents 0.3-1.5x its GPU pools; every prompt fits the
   smallest replica with its output); sometimes a load ramp (the arrival rate grows, or
   falls, threefold over the span);
3. the offered load, uniform in ``LOAD_RANGE``, as ``bench/workloads/load.py`` defines it: the open-loop
   arrivals are rescaled (``bench.workloads.load.at_load``) so that the floor's prefill work
   (``bench.workloads.floor``) over the arrival span is that fraction of the fleet's prefill capacity, the
   sum of the starting replicas' speeds; the sessions' think times are rescaled by the same factor (the
   whole timeline moves together, so a session's later turns do not all pile onto a compressed start),
   and the fleet's changes move with the arrivals (fractions of the span).

Seed sets: ``TUNING_SEEDS`` (1000-1099) to tune policies on, ``HELDOUT_SEEDS`` (2000-2099) to check that
what was tuned holds on scenarios it never saw. Neither ever changes: results stay comparable.
"""

from __future__ import annotations

import math
import random

from bench.sim.components import (
    BurstParams,
    Draft,
    RagParams,
    SessionParams,
    burst,
    rag,
    sessions,
    short_chat,
)
from bench.sim.fleets import DrawnFleet, draw_fleet
from bench.sim.spec import FleetChange, Scenario, SimRequest
from bench.workloads.floor import FloorRequest, floor
from bench.workloads.load import arrival_span, at_load
from bench.workloads.shapes import CHAT, TimedRequest, Workload

TUNING_SEEDS = tuple(range(1000, 1100))
HELDOUT_SEEDS = tuple(range(2000, 2100))
SETS = {"tuning": TUNING_SEEDS, "heldout": HELDOUT_SEEDS}
TARGET_REQUESTS = 600
NOMINAL_SPAN_S = 300.0
LOAD_RANGE = (0.3, 0.95)
PAGE_SIZE = 16
KINDS = (("rag", 0.6), ("sessions", 0.5), ("burst", 0.35), ("chat", 0.4))


def draw(seed: int) -> Scenario:
    return draw_with_floor(seed)[0]


def draw_with_floor(seed: int) -> tuple[Scenario, list[FloorRequest]]:
    """The scenario of ``seed`` and its floor (bench/workloads/floor.py, in request order)."""
    rng = random.Random(f"kvroute-sim:{seed}")
    fleet = draw_fleet(rng)
    kinds = [k for k, p in KINDS if rng.random() < p] or [rng.choice(KINDS)[0]]
    weights = [rng.uniform(0.5, 1.5) for _ in kinds]
    drafts: list[Draft] = []
    for k, (kind, w) in enumerate(zip(kinds, weights, strict=True)):
        count = max(40, round(TARGET_REQUESTS * w / sum(weights)))
        drafts += _component(kind, rng, seed * 100 + k, count, fleet)
    if rng.random() < 0.3:
        _ramp(drafts, rising=rng.random() < 0.5)
        kinds.append("ramp")
    load = round(rng.uniform(*LOAD_RANGE), 3)
    return _assemble(seed, "+".join(kinds), fleet, drafts, load)


def _component(kind: str, rng: random.Random, seed: int, count: int, fleet: DrawnFleet) -> list[Draft]:
    doc_hi = min(8000, int(0.4 * fleet.min_gpu))
    if kind == "rag":
        lo = min(rng.randint(1500, 4000), doc_hi)
        hi = min(2 * lo, doc_hi)
        docs = round(rng.uniform(0.3, 1.5) * fleet.gpu_total / ((lo + hi) / 2))
        p = RagParams(count, max(8, min(400, docs)), (lo, hi), rng.uniform(0.6, 1.3),
                      rng.choice(("system", "user")), rng.random() < 0.15)  # fmt: skip
        return rag(seed, p, NOMINAL_SPAN_S)
    if kind == "sessions":
        return sessions(seed, _session_params(rng, count, fleet), NOMINAL_SPAN_S)
    if kind == "burst":
        hot = min(rng.randint(20, 80), count)
        b = BurstParams(hot, rng.randint(min(2000, doc_hi), doc_hi), rng.uniform(0.3, 0.7),
                        rng.uniform(0.02, 0.08), count - hot)  # fmt: skip
        return burst(seed, b, NOMINAL_SPAN_S)
    return short_chat(seed, count, NOMINAL_SPAN_S)


def _session_params(rng: random.Random, count: int, fleet: DrawnFleet) -> SessionParams:
    kind = rng.choice(("agent", "coding"))
    turns = rng.randint(3, 10)
    cap = int(0.6 * fleet.min_gpu)
    prefix = min(rng.randint(1000, 8000), int(0.3 * fleet.min_gpu)) if kind == "agent" else 600
    step = (100, 400) if kind == "agent" else (300, 1500)
    think = (2.0, 6.0) if rng.random() < 0.5 else (8.0, 20.0)
    repo = int(rng.uniform(0.15, 0.3) * fleet.min_gpu)
    return SessionParams(count, turns, kind, prefix, rng.randint(1, 4), repo, step, think,
                         rng.random() < 0.6, cap)  # fmt: skip


def _ramp(drafts: list[Draft], rising: bool) -> None:
    """Warps the open-loop arrivals so that their rate goes from 1x to 3x over the span (or 3x to 1x):
    the cumulative count t + t^2/T is proportional to the uniform one's, 2u."""
    span = NOMINAL_SPAN_S
    for d in drafts:
        if d.prev is None:
            u = d.arrival_s if rising else span - d.arrival_s
            t = span * (math.sqrt(1.0 + 8.0 * u / span) - 1.0) / 2.0
            d.arrival_s = t if rising else span - t


def _assemble(
    seed: int, kind: str, fleet: DrawnFleet, drafts: list[Draft], load: float
) -> tuple[Scenario, list[FloorRequest]]:
    order = sorted(range(len(drafts)), key=lambda i: (_root(drafts[i]).arrival_s, i))
    index = {id(drafts[i]): n for n, i in enumerate(order)}
    timed = tuple(_timed(drafts[i], n, index) for n, i in enumerate(order))
    workload = Workload(f"sim-{seed}", kind, timed, sweep=True)
    ideal = floor(workload, PAGE_SIZE, fleet.profile)
    scaled, offered = at_load(workload, ideal, load * fleet.capacity, 1)
    factor = offered.span_s / arrival_span(workload)
    first = min(r.arrival_s for r in scaled.requests if r.after is None)
    changes = tuple(FleetChange(first + f * offered.span_s, k, name) for f, k, name in fleet.changes)
    requests = tuple(_sim_request(r, drafts[order[r.index]], factor) for r in scaled.requests)
    scenario = Scenario(seed, kind, fleet.profile, load, fleet.replicas, changes, requests, PAGE_SIZE)
    return scenario, ideal


def _root(d: Draft) -> Draft:
    """A session's first turn (its arrival orders the session's turns, which follow it in index)."""
    while d.prev is not None:
        d = d.prev
    return d


def _timed(d: Draft, n: int, index: dict[int, int]) -> TimedRequest:
    after = index[id(d.prev)] if d.prev is not None else None
    return TimedRequest(n, d.arrival_s, d.session or f"r{n}", CHAT, d.body, d.tokens, d.tag, after, d.think_s)


def _sim_request(r: TimedRequest, d: Draft, factor: float) -> SimRequest:
    """The request with its think time rescaled like the arrivals (``factor``)."""
    return SimRequest(r.index, r.arrival_s, r.path, r.body, r.tag, d.session, r.after, r.think_s * factor)


def scenario_seeds(name: str, count: int | None) -> tuple[int, ...]:
    """The first ``count`` seeds of the set ``name`` (all of them when None)."""
    seeds = SETS[name]
    return seeds if count is None else seeds[: max(0, count)]
