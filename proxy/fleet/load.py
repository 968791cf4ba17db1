"""Each replica's load, in work rather than request counts: what routing sees of the work in flight.

Every routed request holds a ``Work`` on its replica from the send until its answer is over:

- **queued**: sent, first byte not back. Its own work (prefill of its uncached tokens plus its reloads)
  is queued prefill work, priced when the load is read: uncached tokens x the replica's current seconds
  per token (``view``'s ``s_per_token``, the learned rate) + the reload seconds its ``Prediction`` gave.
  A rate learned after a request was routed so reprices it: early in a run the configured start rate
  can be 5x off the engine's, and work priced at routing time kept that error until its first byte (one
  cold 16K-token document was carried as 20 s queued for its whole wait, ~4.9 s in truth). The engine
  serves prefills first come first served, so the head of the queue has been worked on since the later
  of its send time and the replica's last first byte: that elapsed time (at most the head's own work) is
  not waiting any more. ``queued_prefill_s`` = sum of queued work - that elapsed part, or, while the
  head of the queue is past its first-byte deadline (``proxy/upstream/liveness.py`` keeps it waiting on a
  working replica), the head's wait so far if that is more: the prediction has just been shown at least 4x
  short there (hits predicted at 0.3-1.3 s took 5-8 s on `h200` rag), everything sent after it waits
  behind it, and its wait so far is the best estimate left of what is still ahead.
- **decoding**: first byte back (streams), or, for an answer that is not streamed, once its predicted
  TTFT has passed (the gateway sees no first token then). A decoding request holds a running slot and
  no prefill: it never counts as prefill load. It holds KV memory and a running slot, as a queued one
  does: ``kv_tokens`` sums, over the requests in flight, the KV each holds (its predicted uncached prompt
  + output budget, ``routing.ttft.kv_need``); a decoding request's output budget counts at the
  replica's ``new_token_ratio`` (``reserve``: SGLang charges a running request that fraction of the
  budget it has left, and lowers it towards ~0.1 while nothing is retracted; the emulator, which
  reserves whole outputs, reports 1.0). When a replica's requests fill its
  ``max_running_requests``, or hold half its device pool or more, routing needs how long until a slot or
  memory frees: ``decoding`` lists, per decoding request, the seconds it has decoded, its output budget
  (0 when unbounded) and the KV it holds, filled only then.
- **released** at the end (or on failure): nothing is left behind, exactly once.

A streamed request's first byte that comes while streamed requests sent at least ``OVERTAKE_MARGIN_S``
earlier are past their first-byte deadlines and still wait for theirs counts one **overtake** against
each of them (``Work.overtaken``; before its deadline a request may still be behind on the way in: a
long prompt takes the engine longer to tokenize than a short one sent after it). On a replica that
starts prefills in arrival order (``proxy.fleet.replica_info.in_order``), a request overtaken again and again
is not queued but lost there: ``proxy/dispatch/attempt.py`` stops its first-byte wait from going on past the
deadline while the replica works (``proxy/upstream/liveness.py``).

Live arrivals (not warm-up steps) are also kept as an exponentially decaying rate over ``window_s``
(requests per second), with the time of the last one, and the replica's prefill **utilization** as the
decaying fraction of time its engine spent serving prefills. The engine serves prefills first come first
served, and after a request's prefill comes its fixed overhead (scheduling, the first decode step,
detokenizing: ``overhead_s``, learned), which runs beside the next prefill. So request i's service, from
its first byte and the previous one on the replica, is

    service_i = first_i - max(sent_i + overhead_i, first_(i-1))

(its prefill ended at first_i - overhead_i and started when it was sent or when the previous prefill
ended, whichever was later): measured, so it does not inherit the errors of early predictions. The
fraction of time with *some request outstanding* is not a utilization: each request's own overhead
counts in it, so at a few requests per second it reads 1.0 on a replica whose prefill engine is mostly
idle (it did on every replica of a rag run at load 0.6, with nothing queued), and the placement rule's
1 / (1 - ρ) then prices every copy at its cap. The placement rule prices the delay a new request imposes
on those that will arrive behind it with both (``routing.placement``).

Both averages start from zero, so for the first windows after traffic begins they read low by the factor
``1 - exp(-t / window_s)`` (t: seconds since the fleet's first live request, a ``TrafficEpoch`` that all
replicas of a fleet share): a burst at start-up, exactly when documents are first seen, would look like a
fleet at a fifth of its real load. Both are divided by that factor (the bias correction of an
exponential average started at zero, with t at least ``MIN_ELAPSED_S`` so that one request in the first
instant does not read as a huge rate). A replica that received nothing since then still reads zero.

All times are the event loop's clock (seconds); nothing here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_WINDOW_S = 10.0
MIN_ELAPSED_S = 1.0  # the bias correction treats traffic as at least this old (see the module docstring)
OVERTAKE_MARGIN_S = 0.1  # sent this much later, a request's first byte first is not a race on the wire


@dataclass(slots=True)
class TrafficEpoch:
    """When the fleet's first live request was sent (shared by its replicas' loads)."""

    first_live_s: float | None = None

    def started(self, now: float) -> None:
        if self.first_live_s is None:
            self.first_live_s = now

    def correction(self, now: float, window_s: float) -> float:
        """1 / (1 - exp(-t / window_s)): what a zero-started decaying average is divided by."""
        if self.first_live_s is None:
            return 1.0
        t = max(now - self.first_live_s, MIN_ELAPSED_S)
        return 1.0 / -math.expm1(-t / window_s)


@dataclass(slots=True, eq=False)
class Work:
    """One request's share of a replica's load (identity matters, not value)."""

    sent_s: float
    prefill_tokens: int
    work_s: float  # predicted own prefill + reload seconds (at the rates known when it was routed)
    ttft_s: float  # predicted time to first token (queue included)
    budget: int  # output budget in tokens, 0 = unbounded / unknown
    streamed: bool = True
    live: bool = True  # False: a warm-up step (counts as work, not as live arrivals)
    overhead_s: float = 0.0  # predicted fixed time after its prefill (beside the next prefill)
    reload_s: float = 0.0  # the predicted host / storage reload part of work_s
    kv_tokens: int = 0  # KV it holds while in flight: predicted uncached prompt + output budget
    first_byte_s: float = (
        math.inf
    )  # its first-byte deadline, seconds after the send (proxy/upstream/deadlines.py)
    first_s: float | None = None
    overtaken: int = 0  # streamed requests sent after it whose first byte came while it was overdue


@dataclass(slots=True)
class DecayingRate:
    """An event rate (events or amounts per second) that forgets with time constant ``window_s``."""

    window_s: float = DEFAULT_WINDOW_S
    value: float = 0.0
    at_s: float = 0.0

    def add(self, amount: float, now: float) -> None:
        self.value = self.at(now) + amount / self.window_s
        self.at_s = now

    def at(self, now: float) -> float:
        if now <= self.at_s:
            return self.value
        return self.value * math.exp((self.at_s - now) / self.window_s)


@dataclass(frozen=True, slots=True)
class LoadView:
    """What a snapshot reports of one replica's load at one instant."""

    inflight_requests: int
    inflight_prefill_tokens: int
    inflight_prefill_s: float
    decoding: tuple[tuple[float, int, int], ...]  # (s decoded, budget, KV held), when slots or memory fill
    arrival_rate: float
    utilization: float
    kv_tokens: int = 0


@dataclass(slots=True)
class ReplicaLoad:
    window_s: float = DEFAULT_WINDOW_S
    epoch: TrafficEpoch = field(default_factory=TrafficEpoch)
    queue: dict[Work, None] = field(default_factory=dict)  # send order
    decoding: dict[Work, None] = field(default_factory=dict)
    queued_tokens: int = 0
    queued_work_s: float = 0.0
    queued_reload_s: float = 0.0
    kv_tokens: int = 0  # KV held by every request in flight (queued and decoding)
    running_output: int = 0  # the output-budget part of it that the decoding requests hold
    last_first_s: float = 0.0
    last_live_s: float = float("-inf")  # the last live request sent
    arrivals: DecayingRate = field(default_factory=DecayingRate)
    busy: DecayingRate = field(default_factory=DecayingRate)  # seconds of measured service, per second

    def __post_init__(self) -> None:
        self.arrivals.window_s = self.busy.window_s = self.window_s

    def add(self, w: Work) -> None:
        self.queue[w] = None
        self.queued_tokens += w.prefill_tokens
        self.queued_work_s += w.work_s
        self.queued_reload_s += w.reload_s
        self.kv_tokens += w.kv_tokens
        if w.live:
            self.epoch.started(w.sent_s)
            self.arrivals.add(1.0, w.sent_s)
            self.last_live_s = w.sent_s

    def first_token(self, w: Work, now: float) -> None:
        if w in self.queue:
            if w.streamed:
                self._overtake(w, now)
            self._dequeue(w, now)
            self.busy.add(max(0.0, now - max(w.sent_s + w.overhead_s, self.last_first_s)), now)
            w.first_s = now
            self.last_first_s = max(self.last_first_s, now)
            self.decoding[w] = None
            self.running_output += _output(w)

    def release(self, w: Work, now: float) -> None:
        if w in self.queue:
            self._dequeue(w, now)
        elif w in self.decoding:
            del self.decoding[w]
            self.running_output -= _output(w)
        else:
            return
        self.kv_tokens -= w.kv_tokens

    def view(
        self,
        now: float,
        max_running: int,
        s_per_token: float = 0.0,
        pool_tokens: int = 0,
        reserve: float = 1.0,
    ) -> LoadView:
        """The load now; ``s_per_token`` > 0 reprices queued prefill at that rate; ``pool_tokens`` is the
        device KV pool (0: unknown); ``reserve`` the part of their output budget that running requests
        are charged (the replica's ``new_token_ratio``) (module docstring)."""
        self._promote_unstreamed(now)
        inflight = len(self.queue) + len(self.decoding)
        held = self.held(reserve)
        full = max_running > 0 and inflight >= max_running
        full = full or 0 < pool_tokens <= 2 * held
        decoding = (
            tuple((now - (w.first_s or now), w.budget, _held(w, reserve)) for w in self.decoding)
            if full
            else ()
        )
        unbias = self.epoch.correction(now, self.window_s)
        return LoadView(
            inflight,
            max(0, self.queued_tokens),
            self._queued_s(now, s_per_token),
            decoding,
            self.arrivals.at(now) * unbias,
            min(1.0, self._utilization(now) * unbias),
            held,
        )

    def held(self, reserve: float = 1.0) -> int:
        """The KV its requests in flight hold, the running ones' output budgets charged at ``reserve``."""
        return max(0, _charged(self.kv_tokens, self.running_output, reserve))

    def _utilization(self, now: float) -> float:
        """The decaying fraction of time spent serving, the head of the queue's service so far included."""
        return self.busy.at(now) + self._head_elapsed(now) / self.window_s

    def _queued_s(self, now: float, s_per_token: float = 0.0) -> float:
        if not self.queue:
            return 0.0
        if s_per_token <= 0.0:
            return max(0.0, self.queued_work_s - self._head_elapsed(now), self._overdue_s(now))
        queued = max(0, self.queued_tokens) * s_per_token + self.queued_reload_s
        return max(0.0, queued - self._head_elapsed(now, s_per_token), self._overdue_s(now))

    def _overdue_s(self, now: float) -> float:
        """The head of the queue's wait so far, once it is past its first-byte deadline (else 0)."""
        head = next(iter(self.queue))
        waited = now - head.sent_s
        return waited if waited > head.first_byte_s else 0.0

    def _head_elapsed(self, now: float, s_per_token: float = 0.0) -> float:
        """How long the head of the queue has been served: since the later of its send and the last first
        byte, at most its own work (repriced at ``s_per_token`` when > 0)."""
        head = next(iter(self.queue), None)
        if head is None:
            return 0.0
        own = head.prefill_tokens * s_per_token + head.reload_s if s_per_token > 0.0 else head.work_s
        return min(own, max(0.0, now - max(head.sent_s, self.last_first_s)))

    def _overtake(self, w: Work, now: float) -> None:
        """``w``'s first byte came: each streamed request sent at least ``OVERTAKE_MARGIN_S`` before it,
        still waiting for its own and past its first-byte deadline was overtaken once more (the queue is
        in send order)."""
        for x in self.queue:
            if x is w:
                return
            if x.streamed and w.sent_s - x.sent_s >= OVERTAKE_MARGIN_S and now - x.sent_s > x.first_byte_s:
                x.overtaken += 1

    def _promote_unstreamed(self, now: float) -> None:
        """An answer that is not streamed shows no first byte: past its predicted TTFT it is decoding."""
        late = [w for w in self.queue if not w.streamed and now - w.sent_s >= w.ttft_s]
        for w in late:
            self.first_token(w, w.sent_s + w.ttft_s)

    def _dequeue(self, w: Work, now: float) -> None:
        del self.queue[w]
        self.queued_tokens -= w.prefill_tokens
        self.queued_work_s = max(0.0, self.queued_work_s - w.work_s) if self.queue else 0.0
        self.queued_reload_s = max(0.0, self.queued_reload_s - w.reload_s) if self.queue else 0.0


def _output(w: Work) -> int:
    """The output-budget part of what a request holds."""
    return max(0, w.kv_tokens - w.prefill_tokens)


def _held(w: Work, reserve: float) -> int:
    """What a running request holds, its output budget charged at ``reserve``."""
    return _charged(w.kv_tokens, _output(w), reserve)


def _charged(kv_tokens: int, output_tokens: int, reserve: float) -> int:
    """KV tokens with their output-budget part charged at ``reserve``."""
    return kv_tokens - round((1.0 - reserve) * output_tokens)


def combined(local: LoadView, remote: LoadView) -> LoadView:
    """This gateway's view of a replica's load plus the other gateways' (``proxy/sync/state_sync.py``):
    counts, queued work, held KV and arrival rates add up; the busy fraction is the largest of them; the
    decoding detail is this gateway's (others' requests count, unknown).

    Each gateway measures the service of its own requests, and a request that queued behind the other
    gateways' spans their prefills too: while the replica is busy every gateway that sends to it sees
    the busy time, so each measure is close to the replica's and the largest is the best of them;
    combining them as independent, 1 - (1 - a)(1 - b), overstated it, and three gateways sharing a view
    placed rag's documents worse than one gateway (mean TTFT 1.06x one gateway's over three runs each,
    against 1.00x with the largest)."""
    return LoadView(
        local.inflight_requests + remote.inflight_requests,
        local.inflight_prefill_tokens + remote.inflight_prefill_tokens,
        local.inflight_prefill_s + remote.inflight_prefill_s,
        local.decoding,
        local.arrival_rate + remote.arrival_rate,
        max(min(local.utilization, 1.0), min(remote.utilization, 1.0)),
        local.kv_tokens + remote.kv_tokens,
    )
