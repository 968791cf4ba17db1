"""Table tests of the default cost policy: every Reason, spreading, spilling, tiers and sessions."""

from __future__ import annotations

from collections import Counter

import pytest

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.policies.cost import LoadTiePicker, SessionPicker
from routing.protocols import Scored
from routing.types import NO_MATCH, Candidate, PrefixMatch, Reason, ReplicaState, Report, RoutingRequest
from tests.routing.harness import PolicyHarness


def CostPolicy(cfg: RoutingConfig) -> PolicyHarness:
    return PolicyHarness("cost", cfg)


CFG = RoutingConfig(prefill_tokens_per_s=4000.0, host_load_tokens_per_s=130_000.0, overhead_s=0.05)
IDS = ("r0", "r1", "r2", "r3")


def req(tokens: int = 1000, session: str | None = None, blocks: tuple[int, ...] = (1,)) -> RoutingRequest:
    return RoutingRequest(
        model="m", block_hashes=blocks, prompt_tokens=tokens, block_tokens=16.0, session_key=session
    )


def cand(
    rid: str,
    *,
    gpu: float = 0,
    host: float = 0,
    storage: float = 0,
    prefill: int = 0,
    running: int = 0,
    max_running: int = 0,
    healthy: bool = True,
) -> Candidate:
    state = ReplicaState(
        id=rid,
        healthy=healthy,
        inflight_requests=running,
        inflight_prefill_tokens=prefill,
        max_running_requests=max_running,
    )
    return Candidate(state, PrefixMatch(gpu, host, storage))


def test_misses_spread_over_idle_replicas_whatever_the_list_order() -> None:
    policy = CostPolicy(CFG)
    counts = Counter(policy.route(req(), [cand(r) for r in IDS]).replica for _ in range(400))
    assert set(counts) == set(IDS) and min(counts.values()) > 60
    assert policy.route(req(), [cand(r) for r in IDS]).reason is Reason.LEAST_COST


@pytest.mark.parametrize(
    ("holder", "reason"),
    [
        (cand("r1", gpu=39_000), Reason.PREFIX_GPU),
        (cand("r1", gpu=1000, host=38_000), Reason.PREFIX_HOST),
        (cand("r1", storage=38_000), Reason.PREFIX_STORAGE),
    ],
)
def test_a_cached_document_wins_from_any_tier_over_a_cold_prefill(holder: Candidate, reason: Reason) -> None:
    d = CostPolicy(CFG).route(req(40_000), [cand("r0"), holder, cand("r2")])
    assert (d.replica, d.reason) == ("r1", reason)
    assert d.match == holder.match
    assert d.terms.prefill_s == pytest.approx((40_000 - holder.match.total_tokens) / 4000.0)
    assert d.ranked[0] == "r1" and set(d.ranked) == {"r0", "r1", "r2"}


def test_host_reload_beats_a_cold_prefill_but_not_a_gpu_hit() -> None:
    d = CostPolicy(CFG).route(req(40_000), [cand("r0", host=39_000), cand("r1", gpu=39_000), cand("r2")])
    assert d.replica == "r1"
    d = CostPolicy(CFG).route(req(40_000), [cand("r0", host=39_000), cand("r2")])
    assert (d.replica, d.reason) == ("r0", Reason.PREFIX_HOST)
    assert d.terms.reload_s == pytest.approx(39_000 / 130_000.0)


def test_a_hot_prefix_spills_when_its_holder_queue_grows() -> None:
    quiet = CostPolicy(CFG).route(req(8200), [cand("r0", gpu=8000, prefill=1000), cand("r1")])
    assert (quiet.replica, quiet.reason) == ("r0", Reason.PREFIX_GPU)
    busy = CostPolicy(CFG).route(req(8200), [cand("r0", gpu=8000, prefill=40_000), cand("r1")])
    assert (busy.replica, busy.reason) == ("r1", Reason.LEAST_COST)
    assert busy.terms.queue_s == 0.0


def test_a_holder_busy_with_one_cold_prefill_still_beats_an_idle_cold_replica() -> None:
    # the request in flight at r0 is on average half done: waiting ~1500 tokens beats computing 3000
    d = CostPolicy(CFG).route(req(3100), [cand("r0", gpu=3000, prefill=3000, running=1), cand("r1")])
    assert (d.replica, d.reason) == ("r0", Reason.PREFIX_GPU)
    assert d.terms.queue_s == pytest.approx(1500 / 4000.0)


def test_the_hot_spot_guard_moves_requests_off_a_replica_far_above_the_mean() -> None:
    cands = [cand("r0", gpu=8000, running=9), cand("r1", running=1), cand("r2", running=2)]
    d = CostPolicy(CFG).route(req(8200), cands)
    assert (d.replica, d.reason) == ("r1", Reason.FALLBACK)
    off = CostPolicy(RoutingConfig(hot_spill_factor=0)).route(req(8200), cands)
    assert off.replica == "r0"


def test_slot_wait_counts_requests_beyond_max_running() -> None:
    cfg = RoutingConfig(hot_spill_factor=0)
    free = CostPolicy(cfg).route(req(2000), [cand("r0", gpu=1000, running=3, max_running=4), cand("r1")])
    full = CostPolicy(cfg).route(req(2000), [cand("r0", gpu=1000, running=12, max_running=4), cand("r1")])
    assert free.replica == "r0" and full.replica == "r1"


def test_a_tie_broken_away_from_the_longer_prefix_is_a_fallback() -> None:
    # r0 holds one block and is marginally cheaper, but busier: within the tie tolerance load decides
    d = CostPolicy(CFG).route(req(10_000), [cand("r0", gpu=16, running=1), cand("r1")])
    assert (d.replica, d.reason) == ("r1", Reason.FALLBACK)


def test_session_sticks_while_its_replica_is_not_overloaded_and_yields_when_it_is() -> None:
    policy = CostPolicy(CFG)
    first = policy.route(req(session="s"), [cand(r) for r in IDS])
    home = first.replica
    others = [r for r in IDS if r != home]
    # the natural pick would be elsewhere (the home replica has a little queue), affinity keeps it home
    again = policy.route(req(session="s"), [cand(home, prefill=1000), *(cand(r) for r in others)])
    assert (again.replica, again.reason) == (home, Reason.SESSION)
    # overloaded: predicted TTFT far above 2x the best, the session moves and follows the new replica
    moved = policy.route(req(session="s"), [cand(home, prefill=40_000), *(cand(r) for r in others)])
    assert moved.replica != home and moved.reason is Reason.LEAST_COST
    back = policy.route(req(session="s"), [cand(home), *(cand(r, prefill=10) for r in others)])
    assert back.replica == moved.replica and back.reason is Reason.SESSION


def test_unhealthy_and_draining_replicas_are_never_chosen() -> None:
    policy = CostPolicy(CFG)
    drain = Candidate(ReplicaState(id="r2", draining=True), PrefixMatch(gpu_tokens=900))
    d = policy.route(req(), [cand("r0", gpu=900, healthy=False), cand("r1"), drain])
    assert d.replica == "r1" and d.ranked == ("r1",)
    with pytest.raises(NoCandidates):
        policy.route(req(), [cand("r0", healthy=False)])


def test_observed_slow_prefill_raises_the_predicted_cost() -> None:
    policy = CostPolicy(CFG)
    before = policy.route(req(4000), [cand("r0")])
    for _ in range(30):
        d = policy.route(req(4000), [cand("r0")])
        policy.observe(req(4000), d, Report(ok=True, prompt_tokens=4000, cached_tokens=0, ttft_s=0.05 + 4.0))
    after = policy.route(req(4000), [cand("r0")])
    assert after.cost > 1.8 * before.cost


def test_a_shared_system_prompt_does_not_pile_onto_one_replica() -> None:
    """Closed loop with the cache model, hot-spot guard off (the cost model alone must spread): 2K shared
    tokens + a unique 400-token tail per request, six requests prefilling at a time."""
    cfg = RoutingConfig(block_chars=64, chars_per_token=4.0, hot_spill_factor=0)
    model, policy = CacheModel(cfg, 16.0), CostPolicy(cfg)
    states = {
        r: ReplicaState(id=r, gpu_tokens=200_000, host_tokens=400_000, write_policy="write_back") for r in IDS
    }
    inflight: list[tuple[str, int]] = []
    counts: Counter[str] = Counter()
    for i in range(120):
        tail = tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + 25))
        r = RoutingRequest(
            model="m", block_hashes=(*range(125), *tail), prompt_tokens=2400, block_tokens=16.0
        )
        snapshot = list(states.values())
        model.sync(snapshot)
        matches = model.match(r, snapshot)
        d = policy.route(r, [Candidate(s, matches.get(s.id, NO_MATCH)) for s in snapshot])
        model.record(r, d.replica)
        counts[d.replica] += 1
        uncached = int(r.prompt_tokens - d.match.total_tokens)
        inflight.append((d.replica, uncached))
        _load(states, d.replica, uncached, +1)
        if len(inflight) > 6:  # requests finish their prefill in arrival order
            _load(states, *inflight.pop(0), -1)
    assert set(counts) == set(IDS)
    assert max(counts.values()) / (120 / 4) <= 1.3


def _load(states: dict[str, ReplicaState], rid: str, tokens: int, sign: int) -> None:
    s = states[rid]
    states[rid] = ReplicaState(
        id=rid,
        gpu_tokens=s.gpu_tokens,
        host_tokens=s.host_tokens,
        write_policy=s.write_policy,
        inflight_requests=s.inflight_requests + sign,
        inflight_prefill_tokens=s.inflight_prefill_tokens + sign * tokens,
    )


def test_forgetting_a_replica_drops_its_sessions_and_rates() -> None:
    policy = CostPolicy(CFG)
    d = policy.route(req(session="s"), [cand("r0"), cand("r1")])
    policy.observe(req(), d, Report(ok=True, prompt_tokens=1000, cached_tokens=0, ttft_s=5.0))
    sessions = _sessions(policy)
    assert policy.rates.own(d.replica) is not None and sessions.sessions.get("s") == d.replica
    policy.forget(d.replica)
    assert policy.rates.own(d.replica) is None and sessions.sessions.get("s") is None


def _sessions(policy: PolicyHarness) -> SessionPicker:
    inner = policy.policy.picker
    while not isinstance(inner, SessionPicker):
        inner = inner.inner  # type: ignore[attr-defined]
    return inner


def _pick(picker: LoadTiePicker, scored: list[tuple[Candidate, float]]) -> Candidate:
    return picker.pick(req(), [Scored(c, cost) for c, cost in scored]).chosen.cand


def test_near_ties_go_to_the_fewest_prefill_tokens_then_least_recent_then_a_seeded_draw() -> None:
    picker = LoadTiePicker(seed=0, rel_tol=0.05)
    holder, idle = cand("r0", gpu=3000, prefill=1000), cand("r1")
    assert _pick(picker, [(holder, 1.0), (idle, 1.02)]) is idle  # a tie: the idle replica copies the prefix
    assert _pick(picker, [(holder, 1.0), (idle, 1.2)]) is holder  # not a tie
    # decoding requests do not hold up a prefill: only prefill tokens in flight break the tie, then the
    # replica chosen least recently (r1 was just chosen above, r2 never)
    decoding, fresh = cand("r1", running=6), cand("r2")
    assert _pick(picker, [(decoding, 1.0), (fresh, 1.0)]) is fresh
    assert _pick(picker, [(decoding, 1.0), (fresh, 1.0)]) is decoding
    draws = Counter(_pick(picker, [(cand("a"), 1.0), (cand("b"), 1.0)]).id for _ in range(100))
    assert set(draws) == {"a", "b"}


def test_new_sessions_sharing_a_system_prompt_spread_over_the_fleet() -> None:
    """r0 holds the shared prefix and stays the cheapest; new sessions still spread by session count."""
    policy = CostPolicy(CFG)
    counts: Counter[str] = Counter()
    reasons: Counter[Reason] = Counter()
    for i in range(40):
        d = policy.route(req(4000, session=f"s{i}"), [cand("r0", gpu=3500), *(cand(r) for r in IDS[1:])])
        counts[d.replica] += 1
        reasons[d.reason] += 1
    assert set(counts) == set(IDS) and max(counts.values()) <= 1.3 * 40 / 4 + 1
    assert reasons[Reason.PREFIX_GPU] > 0 and reasons[Reason.FALLBACK] > 0
    assert _sessions(policy).sessions.held("r0") == counts["r0"]
