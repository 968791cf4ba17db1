"""``PairDispatch``: a routed request on a prefill/decode fleet, over pairs until one answers.

Installed as the app's ``proxy.dispatch.forward.PAIRS``; ``forward`` hands it every request whose ticket names
a prefill server (``Gateway.route`` chose it: the Router saw the prefill servers' snapshot,
``proxy/fleet/fleet.py``). Up to ``1 + retries`` pair attempts (``proxy/disagg/pair.py``), each with a new
room:

- the prefill: the ticket's replica, then the Router's ranking (``decision.ranked``); a prefill that failed
  first is not tried again, one whose decode failed is kept (it holds the prompt's prefix);
- the decode: ranked afresh for every attempt (``routing.decode_placement``: load, memory, transfer) over
  the decode servers serving the model, without the ones that failed first;
- a server whose circuit breaker refuses is skipped; a retry re-targets the ticket when the prefill
  changes (``Router.retarget``), must fit the retry budget and waits a jittered backoff first, as a
  retry of one replica does (``proxy/upstream/retry_budget.py``).
Only a pair that failed before the client got a byte is retried; the last failing server's own 5xx answer
is relayed when no pair did better; no usable pair at all is a 503 naming the missing role.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from aiohttp import web

from proxy.context import Gateway
from proxy.disagg.pair import Pair, PairFailed
from proxy.disagg.report import PdReport
from proxy.dispatch.attempt import Attempt, Tap
from proxy.dispatch.forward import request_id
from proxy.errors import NoReplicaAvailable, UpstreamError
from proxy.observe.access_log import access_of
from proxy.types import ParsedRequest
from proxy.upstream.relay import forward_headers
from proxy.upstream.retry_budget import backoff_s
from routing.decode_placement import DecodeCost, DecodePlacement
from routing.ledger import Ticket
from routing.pipeline import NoCandidates
from routing.types import ReplicaId, Report


class PairDispatch:
    """See the module docstring."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.placement = DecodePlacement(gw.router.cfg)
        self.report = PdReport(gw)

    def serves(self, ticket: Ticket) -> bool:
        return self.gw.fleet.role(ticket.replica) == "prefill"

    def decodes(self, parsed: ParsedRequest, ticket: Ticket, failed: set[ReplicaId]) -> list[DecodeCost]:
        """The decode servers for this request, best first, without those that failed or refuse now."""
        states = [s for s in self.gw.fleet.decodes(parsed.model) if s.id not in failed]
        try:
            ranked = self.placement.rank(states, ticket.request.prompt_tokens, ticket.request.max_new_tokens)
        except NoCandidates:
            return []
        return [c for c in ranked if self.gw.fleet.admits(c.replica)]

    async def forward(
        self, request: web.Request, raw: bytes, parsed: ParsedRequest, ticket: Ticket, tap: Tap | None
    ) -> web.StreamResponse:
        gw = self.gw
        rid = request_id(request) if gw.settings.request_id_headers else None
        headers = forward_headers(request.headers, {"x-request-id": rid} if rid else {})
        access = access_of(request)
        prefills = [ticket.replica, *(r for r in ticket.decision.ranked if r != ticket.replica)]
        failed: dict[str, set[ReplicaId]] = {"prefill": set(), "decode": set()}
        suspects: list[Attempt] = []
        gw.retry_budget.request(time.monotonic())
        last: UpstreamError | None = None
        answered: web.Response | None = None
        for n in range(1 + gw.settings.retries):
            pair_of = self._next_pair(parsed, ticket, prefills, failed)
            if pair_of is None:
                break
            prefill, decode = pair_of
            if n > 0 and not await self._before_retry(parsed, n):
                break
            if not self._admit(prefill, decode.replica):
                continue
            if prefill != ticket.replica:
                ticket = gw.router.retarget(ticket, prefill)
            pair = Pair(gw, ticket, decode, parsed, tap)
            try:
                result = await pair.run(request, raw, headers, rid)
                self._blame(suspects, result.status)
                self.report.pair("answered" if n == 0 else "answered_after_retry")
                return result
            except PairFailed as e:
                if not e.error.retryable:
                    raise e.error from None
                last, answered = e.error, pair.answer or answered
                failed[e.side].add(pair.prefill.replica if e.side == "prefill" else pair.decode.replica)
                self.report.failure(e.side)
            finally:
                pair.finish(access)
                if pair.suspect is not None:
                    suspects.append(pair.suspect)
        self.report.pair("failed")
        gw.router.finish(ticket, Report(ok=False))  # a ticket no pair served (none if one was tried)
        if answered is not None:
            return answered
        raise last or self._nobody(parsed, prefills, failed)

    def _next_pair(
        self,
        parsed: ParsedRequest,
        ticket: Ticket,
        prefills: Sequence[ReplicaId],
        failed: dict[str, set[ReplicaId]],
    ) -> tuple[ReplicaId, DecodeCost] | None:
        fleet = self.gw.fleet
        prefill = next((p for p in prefills if p not in failed["prefill"] and fleet.admits(p)), None)
        decodes = self.decodes(parsed, ticket, failed["decode"])
        return (prefill, decodes[0]) if prefill is not None and decodes else None

    def _admit(self, prefill: ReplicaId, decode: ReplicaId) -> bool:
        """Claims both servers (a half-open breaker's one trial); neither when one refuses."""
        fleet = self.gw.fleet
        if not fleet.admit(prefill):
            return False
        if not fleet.admit(decode):
            fleet.outcome(prefill, None)
            return False
        return True

    async def _before_retry(self, parsed: ParsedRequest, n: int) -> bool:
        gw = self.gw
        if not gw.retry_budget.spend(time.monotonic()):
            gw.metrics.retry_budget_exhausted.labels(parsed.route.value).inc()
            return False
        st = gw.settings
        await asyncio.sleep(backoff_s(n - 1, st.retry_backoff, st.retry_backoff_max))
        return True

    def _blame(self, suspects: list[Attempt], status: int) -> None:
        """Another pair answered below 500: the 5xx answers before it were those servers' fault."""
        if status < 500:
            for a in suspects:
                self.gw.fleet.outcome(a.replica, False, a.failure)

    def _nobody(
        self, parsed: ParsedRequest, prefills: Sequence[ReplicaId], failed: dict[str, set[ReplicaId]]
    ) -> NoReplicaAvailable:
        model = f" serves model {parsed.model!r}" if parsed.model else ""
        if not [p for p in prefills if p not in failed["prefill"] and self.gw.fleet.admits(p)]:
            return NoReplicaAvailable(f"no healthy prefill server{model}")
        return NoReplicaAvailable(f"no healthy decode server{model}")
