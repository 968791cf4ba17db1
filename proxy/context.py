"""The gateway's long-lived collaborators, held in one value under a typed ``web.AppKey``.

``Gateway`` owns no sockets itself: the ClientSession, the health poller and background tasks are
created and closed by ``cleanup_ctx`` generators in ``proxy/server.py``. Its ``decide`` method is steps
3-4 of DESIGN.md's data flow: fleet snapshot + prefix matches → candidates → the policy's Decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.errors import ModelNotFound, NoReplicaAvailable
from proxy.fleet import Fleet
from proxy.metrics import GatewayMetrics
from proxy.settings import Settings
from proxy.upstream import Upstream
from routing.pipeline import FleetSync, NoCandidates, Outcome, Policy, PrefixIndex
from routing.rates import CharsPerToken
from routing.types import NO_MATCH, Candidate, Decision, RoutingRequest

log = logging.getLogger("kvroute.gateway")


class Background:
    """Fire-and-forget tasks (upstream aborts) that must never block a handler; cancelled at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Gateway:
    settings: Settings
    fleet: Fleet
    policy: Policy
    index: PrefixIndex
    metrics: GatewayMetrics
    chars_per_token: CharsPerToken
    background: Background = field(default_factory=Background)
    upstream: Upstream | None = None  # set by the session cleanup_ctx

    @property
    def up(self) -> Upstream:
        if self.upstream is None:
            raise RuntimeError("the upstream session is not open (app not started)")
        return self.upstream

    def check_model(self, model: str | None) -> None:
        """404 model_not_found unless some replica serves ``model`` (``base:adapter`` counts as base)."""
        if model is None:
            return
        known = self.fleet.models()
        if model not in known and model.split(":", 1)[0] not in known:
            raise ModelNotFound(f"The model '{model}' does not exist", param="model")

    def decide(self, req: RoutingRequest, model: str | None) -> Decision:
        states = self.fleet.snapshot(model)
        if isinstance(self.index, FleetSync):
            self.index.sync(states)
        matches = self.index.match(req, states)
        cands = [Candidate(s, matches.get(s.id, NO_MATCH)) for s in states]
        try:
            decision = self.policy.route(req, cands)
        except NoCandidates:
            raise NoReplicaAvailable(
                f"no healthy replica serves model {model!r}" if model else "no healthy replica"
            ) from None
        self.metrics.decisions.labels(self.policy.name, decision.reason.value).inc()
        return decision

    def learn(self, outcome: Outcome, hashed: bool) -> None:
        """Step 6 of the data flow: feed what the replica reported back to the policy and the model."""
        self.policy.observe(outcome)
        self.index.observe(outcome)
        if hashed:
            self.chars_per_token.observe_outcome(outcome, self.settings.routing.block_chars)

    def forget(self, replica: str) -> None:
        """A replica left the fleet: drop what the model and the policy knew of it."""
        self.index.forget(replica)
        forget = getattr(self.policy, "forget", None)
        if callable(forget):
            forget(replica)

    def restarted(self, replica: str) -> None:
        """A replica restarted or flushed its cache: its GPU and host tiers are gone, its storage tier
        survives; learned rates and sessions stay (same hardware, and a session's next turn costs the
        same everywhere now)."""
        self.index.restart(replica)
        restart = getattr(self.policy, "restart", None)
        if callable(restart):
            restart(replica)


GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
