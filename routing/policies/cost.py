"""The default policy ("cost"): place each request where it costs the fleet the least time.

The composition (``routing.protocols``), each exit naming a Reason:

1. Filter: healthy, not draining replicas (``HealthyFilter``).
2. Score (``routing.placement.PlacementScorer``): predicted TTFT there (queue of prefill work and
   running-slot wait, or the wait for KV memory if later + prefill of the uncached tokens +
   host/storage reload + overhead, rates learned online, ``routing.ttft``) plus the delay the
   request's own work imposes on the requests that will arrive behind it there,
   ``x · λ · (W + x) / (1 - ρ)``, minus what a copy of the request's shared prefix there is worth to
   the requests that will share it (``γ · λ_P · (W_H + x) · max(0, W_H - W) / (k + 1)``, its
   demand counted by ``routing.demand``). A shared prefix cached everywhere costs the same everywhere and does
   not attract traffic; a document cached on one replica is a cheap hit there and a costly copy
   elsewhere, which a busy fleet pays for many times; it is copied when its holder nears saturation.
3. Pick (``LoadTiePicker``): lowest cost; costs within ``tie_rel_tol`` (or ``tie_abs_s``) of the best tie
   and go to the fewest prefill tokens in flight, then to the least recently chosen, then to a seeded
   draw, so misses spread evenly over idle replicas.
4. Session affinity (``SessionPicker``): a session (an explicit conversation key: ``x-session-id``, or
   the header or body field the config names; never OpenAI's ``user``, which names the end user)
   returns to the replica of its previous turn unless its predicted TTFT there exceeds the best by
   ``session_overload_factor`` (Reason SESSION when it changed the pick): a session yields to its own
   latency, not to the delay it imposes on others (it is one conversation's next turn, and its home
   holds its history). A new session avoids replicas
   holding more than ``session_spread_factor`` x the fewest sessions any replica holds + 1 (Reason
   FALLBACK when that moved it): sessions are long-lived and grow, so a shared system prompt must not
   gather every session on its first holders. It moves only where its predicted TTFT is within
   ``session_overload_factor`` of the pick's: the same bound a session's later turns stay within, so
   a session is never sent where its next turn would leave at once, and a large shared prompt is not
   copied to every replica for the sake of a count.

Reasons otherwise (``explain``): PREFIX_GPU / PREFIX_HOST / PREFIX_STORAGE when the chosen replica's
match is at least one block and mostly in that tier, LEAST_COST when it has none, FALLBACK when a tie was
broken away from a replica holding a longer prefix. Cost: O(replicas) per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from routing.config import RoutingConfig
from routing.demand import DemandBook
from routing.pipeline import HealthyFilter, Pipeline, near_ties
from routing.placement import PlacementScorer
from routing.protocols import Pick, Picker, Scored, Stage
from routing.rates import RateBook
from routing.session import SessionTable, should_stick
from routing.types import Reason, ReplicaId, RoutingRequest


class LoadTiePicker(Stage):
    """Lowest cost; near-ties go to the fewest prefill tokens in flight, then to the replica chosen least
    recently (so sequential misses at low concurrency rotate over idle replicas instead of clustering,
    and their GPU and host pools fill evenly), then to the lowest ``xxh3(seed, request key, replica)``
    (replicas never chosen yet): a draw that every gateway makes alike for the same request, so gateways
    sharing state agree (``chose`` is also told about the requests other gateways routed). Requests
    that are only decoding do not count: they do not hold up a prefill. O(n) per pick."""

    def __init__(self, seed: int, rel_tol: float, abs_tol: float = 1e-9) -> None:
        self._seed = seed.to_bytes(8, "little", signed=False)
        self._rel_tol = rel_tol
        self._abs_tol = abs_tol
        self._clock = 0
        self._last_pick: dict[ReplicaId, int] = {}

    def pick(self, req: RoutingRequest, scored: Sequence[Scored]) -> Pick:
        ties = near_ties(scored, self._rel_tol, self._abs_tol)
        if len(ties) > 1:
            least = min(s.cand.state.inflight_prefill_tokens for s in ties)
            ties = [s for s in ties if s.cand.state.inflight_prefill_tokens == least]
        if len(ties) > 1:
            oldest = min(self._last_pick.get(s.id, -1) for s in ties)
            ties = [s for s in ties if self._last_pick.get(s.id, -1) == oldest]
        if len(ties) == 1:
            return Pick(ties[0])
        key = self._seed + request_key(req)
        return Pick(min(ties, key=lambda s: xxhash.xxh3_64_intdigest(key + s.id.encode())))

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        self._clock += 1
        self._last_pick[replica] = self._clock

    def forget(self, replica: ReplicaId) -> None:
        self._last_pick.pop(replica, None)


def request_key(req: RoutingRequest) -> bytes:
    """What makes requests differ for a draw: the last block (it names the whole prompt: requests that
    share only a system prompt draw apart, on every gateway alike), else the session, else the size."""
    if req.block_hashes:
        return req.block_hashes[-1].to_bytes(8, "little")
    if req.session_key:
        return req.session_key.encode()
    return req.prompt_tokens.to_bytes(8, "little")


class Wrapper(Stage):
    """A picker around another one: lifecycle hooks reach the inner picker too."""

    def __init__(self, inner: Picker) -> None:
        self.inner = inner

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        self.inner.chose(req, replica)

    def forget(self, replica: ReplicaId) -> None:
        self.inner.forget(replica)

    def restart(self, replica: ReplicaId) -> None:
        self.inner.restart(replica)


class SessionPicker(Wrapper):
    """Session affinity that yields under overload (step 4 of the module docstring)."""

    def __init__(self, inner: Picker, sessions: SessionTable, cfg: RoutingConfig) -> None:
        super().__init__(inner)
        self.sessions = sessions
        self._cfg = cfg

    def pick(self, req: RoutingRequest, scored: Sequence[Scored]) -> Pick:
        pick = self.inner.pick(req, scored)
        key = req.session_key
        sticky = self.sessions.get(key)
        if sticky is not None and sticky != pick.chosen.id:
            ttfts = {s.id: _ttft(s) for s in scored}
            if should_stick(ttfts, sticky, self._cfg.session_overload_factor):
                return Pick(next(s for s in scored if s.id == sticky), Reason.SESSION)
        elif sticky is None and key:
            crowded = self.sessions.crowded([s.id for s in scored], self._cfg.session_spread_factor)
            if pick.chosen.id in crowded:
                roomy = self.inner.pick(req, [s for s in scored if s.id not in crowded]).chosen
                ttfts = {roomy.id: _ttft(roomy), pick.chosen.id: _ttft(pick.chosen)}
                if should_stick(ttfts, roomy.id, self._cfg.session_overload_factor):
                    return Pick(roomy, Reason.FALLBACK)
        return pick

    def chose(self, req: RoutingRequest, replica: ReplicaId) -> None:
        self.sessions.remember(req.session_key, replica)
        super().chose(req, replica)

    def forget(self, replica: ReplicaId) -> None:
        self.sessions.forget_replica(replica)
        super().forget(replica)


def _ttft(s: Scored) -> float:
    """The predicted TTFT there (the cost when a scorer gives no terms): what sessions are bound by."""
    return s.terms.total if s.terms is not None else s.cost


def explain(req: RoutingRequest, chosen: Scored, scored: Sequence[Scored]) -> Reason:
    """The tier the chosen replica's match is mostly in, or why none (module docstring)."""
    best = min(scored, key=lambda s: s.cost)
    block = max(req.block_tokens, 1e-9)
    m = chosen.cand.match
    if best is not chosen and best.cand.match.total_tokens >= m.total_tokens + block:
        return Reason.FALLBACK
    if m.total_tokens < block:
        return Reason.LEAST_COST
    tiers = (
        (m.gpu_tokens, Reason.PREFIX_GPU),
        (m.host_tokens, Reason.PREFIX_HOST),
        (m.storage_tokens, Reason.PREFIX_STORAGE),
    )
    return max(tiers, key=lambda t: t[0])[1]


def cost(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    ties = LoadTiePicker(cfg.seed, cfg.tie_rel_tol, cfg.tie_abs_s)
    picker = SessionPicker(ties, SessionTable(cfg.max_sessions), cfg)
    demand = DemandBook(cfg.demand_half_life)
    scorer = PlacementScorer(rates, cfg.default_new_tokens, cfg.max_utilization, cfg.copy_worth, demand)
    return Pipeline("cost", [HealthyFilter()], scorer, picker, explain)
