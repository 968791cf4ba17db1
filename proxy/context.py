"""The gateway's long-lived collaborators, held in one value under a typed ``web.AppKey``.

``Gateway`` owns no sockets itself: the ClientSession, the health poller and background tasks are
created and closed by ``cleanup_ctx`` generators in ``proxy/server.py``. It holds the fleet, the
upstream client, the deadlines (``proxy/upstream/deadlines.py``), the retry budget
(``proxy/upstream/retry_budget.py``), the metrics, admission (``proxy/fleet/admission.py``), the client API
keys and their rate limits (``proxy/tenancy/keys.py``, ``proxy/tenancy/rate_limit.py``) and the
``routing.router.Router``, the one door into routing: ``route`` turns a parsed request and the fleet's
snapshot into a ``Ticket`` (or a 503), counting the decision. The snapshot holds only the replicas below their
waiting bound (``proxy/fleet/admission.py``: 429 when none is).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.config.settings import Settings
from proxy.errors import ModelNotFound, NoReplicaAvailable
from proxy.exact.tokenizer import PromptTokenizer
from proxy.fleet.admission import Admission
from proxy.fleet.fleet import Fleet
from proxy.fleet.model_names import resolve
from proxy.observe.metrics import GatewayMetrics
from proxy.tenancy.keys import KeyRing, load_keys
from proxy.tenancy.rate_limit import RateLimiter
from proxy.types import ParsedRequest
from proxy.upstream.client import Upstream
from proxy.upstream.deadlines import Deadlines
from proxy.upstream.liveness import Liveness
from proxy.upstream.retry_budget import RetryBudget
from routing.ledger import Ticket
from routing.pipeline import NoCandidates
from routing.router import Router

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
    router: Router
    metrics: GatewayMetrics
    background: Background = field(default_factory=Background)
    upstream: Upstream | None = None  # set by the session cleanup_ctx
    admission: Admission = field(init=False)
    keys: KeyRing | None = field(init=False)  # client API keys (``--api-keys``), None: open
    limiter: RateLimiter = field(default_factory=RateLimiter)
    deadlines: Deadlines = field(init=False)  # from the settings (proxy/upstream/deadlines.py)
    liveness: Liveness = field(
        init=False
    )  # when each replica last sent body bytes (proxy/upstream/liveness.py)
    retry_budget: RetryBudget = field(init=False)  # shared by every request (proxy/upstream/retry_budget.py)
    tokenizer: PromptTokenizer | None = (
        None  # --tokenizer-path: prompts as token ids (proxy/exact/tokenizer.py)
    )

    def __post_init__(self) -> None:
        self.deadlines = Deadlines.of(self.settings)
        self.liveness = Liveness(self.settings.first_byte_timeout)
        self.retry_budget = RetryBudget(self.settings.retry_budget, self.settings.retry_budget_floor)
        self.keys = load_keys(self.settings.api_keys) if self.settings.api_keys else None
        st = self.settings
        self.admission = Admission(st.max_inflight, st.max_waiting_per_replica, st.max_queue_s)
        self.admission.on_reject = lambda reason: self.metrics.rejections.labels(reason).inc()
        a = self.admission
        self.metrics.register_source(
            "admission", lambda: {"inflight": a.inflight, "draining": float(a.draining)}, "Admission", "field"
        )
        self.metrics.register_section("admission", a.status)

    @property
    def up(self) -> Upstream:
        if self.upstream is None:
            raise RuntimeError("the upstream session is not open (app not started)")
        return self.upstream

    def resolve_model(self, parsed: ParsedRequest) -> ParsedRequest:
        """The request for the served model its ``model`` means (``proxy/fleet/model_names.py``); 404
        model_not_found when there is none, 503 when no replica has answered yet (no model is known). A
        request without a model (``/generate``) is unchanged."""
        if parsed.model is None:
            return parsed
        st = self.settings
        served = self.fleet.models()
        model = resolve(parsed.model, served, dict(st.model_aliases), st.single_model_fallback)
        if model is None and not served:  # no replica ever answered: nothing is known of any model
            tried = self.fleet.answers()
            raise NoReplicaAvailable(
                f"no replica has answered yet; tried: {tried}"
                if self.fleet.replicas()
                else "no replica in the fleet"
            )
        if model is None:
            known = ", ".join(sorted(served))
            raise ModelNotFound(f"The model '{parsed.model}' does not exist (served: {known})", param="model")
        if model == parsed.model:
            return parsed
        return dataclasses.replace(
            parsed, model=model, routing=dataclasses.replace(parsed.routing, model=model)
        )

    async def exact(self, parsed: ParsedRequest) -> ParsedRequest:
        """The request with its prompt as the engine's token ids when the gateway has a tokenizer."""
        return parsed if self.tokenizer is None else await self.tokenizer.tokenized(parsed)

    def route(self, parsed: ParsedRequest) -> Ticket:
        """Steps 2-5 of the data flow: the snapshot of the replicas serving the model → the Router."""
        try:
            states = self.admission.admissible(self.fleet.snapshot(parsed.model), self.fleet)
            ticket = self.router.route(parsed.routing, states)
        except NoCandidates:
            model = parsed.model
            what = f"no healthy replica serves model {model!r}" if model else "no healthy replica"
            raise NoReplicaAvailable(f"{what}; tried: {self.fleet.answers()}") from None
        self.metrics.decisions.labels(self.router.name, ticket.decision.reason.value).inc()
        return ticket


GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
