"""A simulated scenario as real HTTP requests, and the wall-clock time scale it is replayed at.

The simulator's requests (``bench.sim.spec.SimRequest``) become ``bench.workloads.shapes.TimedRequest``
values with the same index, body, path, tag and closed-loop link; the only change is time. A scenario is
replayed at ``scale`` wall seconds per modelled second, applied to everything at once and in the same
proportion: the open-loop arrivals and the sessions' think times (here), the fleet changes (``changes``)
and every emulated duration (the emulators' ``--time-scale``, ``bench.confirm.fleet``). The TTFTs the
client measures are divided by the same scale, so they read as modelled seconds, like the simulator's.

``time_scale(sim_end_s)`` picks the scale from how long the scenario lasts in the simulator (the latest
end of any simulated system): ``WALL_TARGET_S / sim_end_s``, clamped to [``MIN_SCALE``, ``MAX_SCALE``]
and rounded to 3 digits. It is deterministic (the simulator is), so a scenario is always replayed at the
same scale. Above 1 the run is slowed down (most scenarios last 10-80 modelled seconds: 600 streamed
requests in 10 s would be as much a test of the machine's two cores as of the routers); below 1 a long
scenario is compressed proportionally. Either way the gateway's and the client's own CPU time are the
only things that do not scale: at a small scale they weigh more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.sim.jobs import Job
from bench.sim.spec import FleetChange, Scenario, SimRequest
from bench.workloads.shapes import TimedRequest

WALL_TARGET_S = 40.0  # wall seconds one system's run should take, roughly
MIN_SCALE, MAX_SCALE = 0.1, 2.0


def time_scale(sim_end_s: float, target_s: float = WALL_TARGET_S) -> float:
    """Wall seconds per modelled second for a scenario that ends at ``sim_end_s`` modelled seconds."""
    if not sim_end_s > 0:
        return 1.0
    return round(min(MAX_SCALE, max(MIN_SCALE, target_s / sim_end_s)), 3)


@dataclass(frozen=True, slots=True)
class RealWorkload:
    """The scenario's requests in wall seconds (``scale`` applied) and which ones carry x-session-id."""

    seed: int
    scale: float
    requests: tuple[TimedRequest, ...]
    sticky: frozenset[int]  # indexes of the requests sent with an x-session-id header
    changes: tuple[FleetChange, ...]  # at_s in wall seconds from the start

    def children(self) -> dict[int, list[TimedRequest]]:
        """Closed-loop turns by the request they follow."""
        out: dict[int, list[TimedRequest]] = {}
        for r in self.requests:
            if r.after is not None:
                out.setdefault(r.after, []).append(r)
        return out


def translate(scenario: Scenario, jobs: Sequence[Job], scale: float) -> RealWorkload:
    """The scenario replayed at ``scale`` (module docstring); ``jobs`` give the prompt token counts."""
    tokens = {j.index: j.prompt_tokens for j in jobs}
    requests = tuple(_timed(r, tokens.get(r.index, 0), scale) for r in scenario.requests)
    sticky = frozenset(r.index for r in scenario.requests if r.session is not None)
    changes = tuple(FleetChange(c.at_s * scale, c.kind, c.replica) for c in scenario.changes)
    return RealWorkload(scenario.seed, scale, requests, sticky, changes)


def _timed(r: SimRequest, prompt_tokens: int, scale: float) -> TimedRequest:
    session = r.session if r.session is not None else f"r{r.index}"
    return TimedRequest(r.index, r.arrival_s * scale, session, r.path, r.body, prompt_tokens, r.tag,
                        r.after, r.think_s * scale)  # fmt: skip
