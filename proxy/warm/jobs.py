"""Warm-up jobs: the worker that prefills documents, and re-warming.

``WarmJobs`` is the registry of ``proxy/warm/registry.py`` (jobs, their documents and the states of each
on its replicas) with the worker that moves documents through those states.

**The worker yields to live traffic.** At most one warm-up step is in flight per replica, and every step
(not only a document's first) starts only when the replica has no live prefill queued and none arrived
in the last ``quiet_s`` seconds (``--warmup-quiet``, 1 s); each step is sized when it is sent
(``proxy.warm.documents``), in time as well as tokens: while live requests arrive anywhere in the fleet (the
load window's arrival rate) at most ``step_s`` (``--warmup-step``, 0.15 s) of predicted prefill on that
replica (its learned prefill rate) and ``step_tokens`` (1024), otherwise ``idle_step_s``
(``--warmup-idle-step``, 0.5 s) and ``idle_step_tokens`` (8192): a fleet with nothing else to do warms
in steps long enough that their fixed cost is small. So a live request waits at most one step's prefill
behind a warm-up: ~0.15 s while live traffic flows, ~0.5 s for the first live request after a quiet
spell (a token-only bound would be worth seconds on a slow replica). And a live request sent to a
replica where a step is running preempts it: the step is aborted (``POST /abort_request`` with its rid),
so the live request waits for the prefill chunk in progress at most; the engine keeps the chunks it had
computed (SGLang's ``cache_unfinished_req``), and the step is sent again once the replica is quiet. Each
step holds a load lease like any request, so live routing sees it as queued work, and its ticket records
the prefix in the cache model (live requests that start with it route to it). In a prefill/decode
fleet documents are warmed on prefill servers only (the fleet's snapshot is theirs), each step with
SGLang's fake transfer (``proxy/fleet/roles.py``): a prefill computes it with no decode server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from proxy.context import Gateway
from proxy.errors import UpstreamError
from proxy.fleet.load import Work
from proxy.fleet.roles import FAKE_BOOTSTRAP, with_fields
from proxy.types import Usage
from proxy.upstream.relay import body_usage
from proxy.warm.documents import Document, Step
from proxy.warm.registry import Job, Placement, WarmDoc, WarmRegistry
from routing.ttft import kv_need
from routing.types import ReplicaId, Report

log = logging.getLogger("kvroute.warmup")
STEP_TIMEOUT_S = 600.0
REWARM_CHECK_S = 2.0  # how often documents are checked against the cache model
STEP_TOKENS = 1024  # a step's token bound while live requests arrive (its time bound: --warmup-step)
IDLE_STEP_TOKENS = 8192  # and while none do (--warmup-idle-step)
MIN_STEP_TOKENS = 256
QUIET_POLL_S = 0.02  # how often a step waiting for a quiet replica looks again
LIVE_RATE = 0.05  # live arrivals per second (smoothed) above which live traffic is flowing
COLD_FRACTION = 0.5  # below this fraction of the document in the cache model, it is cold there


class WarmJobs(WarmRegistry):
    """The registry and the worker (one per gateway; started by a cleanup_ctx in proxy/server.py)."""

    def __init__(self, gw: Gateway) -> None:
        super().__init__(gw)
        st = gw.settings
        self.step_tokens, self.step_s = STEP_TOKENS, st.warmup_step
        self.idle_step_tokens, self.idle_step_s = IDLE_STEP_TOKENS, st.warmup_idle_step
        self.quiet_s = st.warmup_quiet
        self._running: dict[ReplicaId, str] = {}  # the rid of the step in flight on each replica
        self._preempted: set[str] = set()
        self.preemptions = 0
        self._busy: set[ReplicaId] = set()
        self.steps_sent = 0

    # ---- the worker ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Dispatches steps and re-warms until cancelled."""
        last_check = 0.0
        while True:
            self._dispatch()
            if time.monotonic() - last_check >= REWARM_CHECK_S:
                self._rewarm()
                last_check = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):  # not wait_for: on 3.11 it can swallow a cancel
                    await self._wake.wait()
            self._wake.clear()

    def _dispatch(self) -> None:
        now = time.monotonic()
        for job in list(self.jobs.values()):
            for d in job.docs:
                for p in d.placements:
                    if now >= job.expires_s and p.status in ("queued", "cold", "warm"):
                        p.status = "expired"
                    elif p.status == "queued" and self._may_start(p.replica, now):
                        p.status = "warming"
                        self._busy.add(p.replica)
                        self.gw.background.spawn(self._warm(job, d, p))
            if job.settled():
                job.done.set()

    def _may_start(self, replica: ReplicaId, now: float) -> bool:
        return replica not in self._busy and self._is_quiet(replica, now)

    def _is_quiet(self, replica: ReplicaId, now: float) -> bool:
        """Healthy, no live prefill queued, and no live request arrived in the last ``quiet_s``."""
        r = self.gw.fleet.get(replica)
        if r is None or not r.healthy:
            return False
        return not r.load.queue and now - r.load.last_live_s >= self.quiet_s

    def _step_chars(self, replica: ReplicaId) -> int:
        """While live requests arrive anywhere in the fleet (within the load window: any replica may
        get the next one) ``step_tokens`` and ``step_s`` of predicted prefill, whichever is smaller;
        else ``idle_step_tokens`` and ``idle_step_s``; in characters of the estimate."""
        now = time.monotonic()
        live = any(r.load.arrivals.at(now) > LIVE_RATE for r in self.gw.fleet.replicas())
        cap, seconds = (self.step_tokens, self.step_s) if live else (self.idle_step_tokens, self.idle_step_s)
        tokens = min(
            cap, max(MIN_STEP_TOKENS, seconds * self.gw.router.rates.get(replica).prefill_tokens_per_s)
        )
        return int(tokens * self.gw.router.tokens.bytes_per_token)

    async def _warm(self, job: Job, d: WarmDoc, p: Placement) -> None:
        started = time.monotonic()
        try:
            self.counted(d, await self._steps(d.doc, p.replica))
            p.status, p.error, p.warmed_at = "warm", None, time.monotonic()
        except UpstreamError as e:
            p.status, p.error = "failed", e.message
            log.warning("warm-up of a document on %s failed: %s", p.replica, e.message)
        finally:
            p.seconds = time.monotonic() - started
            self._busy.discard(p.replica)
            self._wake.set()

    async def _steps(self, doc: Document, replica: ReplicaId) -> int | None:
        """Cut after cut: each step waits until the replica is quiet and is sized when it is sent; a
        step a live request preempted is sent again (what it had computed is cached by then). The prompt
        tokens the replica reported for the last step, the whole document (None if it reported none)."""
        cut, length = 0, doc.cut_length()
        while True:
            await self._until_quiet(replica)
            nxt = min(length, cut + self._step_chars(replica))
            usage = await self._send(doc.step(nxt, "kvroute-warm-" + uuid.uuid4().hex), replica)
            if usage is None:
                continue
            cut = nxt
            if cut >= length:
                return usage.prompt_tokens

    def preempt(self, replica: ReplicaId) -> None:
        """A live request was just sent to ``replica``: the warm-up step running there is aborted, so
        the live request waits for at most the chunk in progress (``Fleet.live_arrived``)."""
        rid = self._running.get(replica)
        if rid is None or rid in self._preempted:
            return
        self._preempted.add(rid)
        self.preemptions += 1
        self.gw.background.spawn(self.gw.up.abort(replica, rid))

    async def _until_quiet(self, replica: ReplicaId) -> None:
        """Polls until the replica is quiet; raises UpstreamError when it is gone or unhealthy."""
        while not self._is_quiet(replica, time.monotonic()):
            r = self.gw.fleet.get(replica)
            if r is None or not r.healthy:
                raise UpstreamError(f"replica {replica} left or became unhealthy during the warm-up")
            await asyncio.sleep(QUIET_POLL_S)

    async def _send(self, step: Step, replica: ReplicaId) -> Usage | None:
        """One step under a load lease: what the replica reported of it; None when a live request
        preempted it (not an error)."""
        gw = self.gw
        states = gw.fleet.snapshot(step.parsed.model)
        ticket = gw.router.assign((await gw.exact(step.parsed)).routing, states, replica)
        terms = ticket.prediction.terms
        work = Work(
            time.monotonic(), round(terms.uncached_tokens), terms.prefill_s + terms.reload_s, terms.total,
            budget=0, streamed=False, live=False, reload_s=terms.reload_s,
            kv_tokens=round(kv_need(ticket.request, terms.uncached_tokens, 1)),
        )  # fmt: skip
        lease = gw.fleet.acquire(replica, work)
        report = Report(ok=False)
        t0 = time.monotonic()
        rid = step.parsed.rid or ""
        self._running[replica] = rid
        try:
            data = step.body
            if gw.fleet.role(replica) == "prefill":  # no decode: SGLang's fake transfer (fleet/roles.py)
                data = with_fields(data, {}, FAKE_BOOTSTRAP)
            status, body = await gw.up.call(replica, "POST", step.path, STEP_TIMEOUT_S, data=data)
            if rid in self._preempted:
                return None
            if status >= 400:
                raise UpstreamError(f"{step.path} answered HTTP {status}")
            u = body_usage(body)
            report = Report(True, u.prompt_tokens, u.cached_tokens, time.monotonic() - t0)
            self.steps_sent += 1
            return u
        finally:
            self._running.pop(replica, None)
            self._preempted.discard(rid)
            lease.release()
            gw.router.finish(ticket, report)

    def _rewarm(self) -> None:
        """Documents that left every tier of a replica are warmed again while their job lives."""
        now = time.monotonic()
        for job in self.jobs.values():
            if now >= job.expires_s:
                continue
            for d in job.docs:
                cold = [p for p in d.placements if p.status == "warm" and self._is_cold(d, p)]
                for p in cold:
                    p.status, p.rewarms = "queued", p.rewarms + 1
                    job.done.clear()
                if cold:
                    self._wake.set()

    def _is_cold(self, d: WarmDoc, p: Placement) -> bool:
        states = self.gw.fleet.snapshot(d.doc.model)
        held = self.gw.router.where(d.routing, states).get(p.replica)
        return held is None or held.total_tokens < COLD_FRACTION * d.tokens
