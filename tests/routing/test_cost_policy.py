"""Table tests of the default cost policy: the placement rule's terms, every Reason, sessions, ties."""

from __future__ import annotations

from collections import Counter

import pytest

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.placement import imposed_delay_s
from routing.policies.cost import LoadTiePicker, SessionPicker
from routing.protocols import Scored
from routing.ttft import memory_wait_s, slot_wait_s
from routing.types import NO_MATCH, Candidate, PrefixMatch, Reason, ReplicaState, Report, RoutingRequest
from tests.routing.harness import PolicyHarness

CFG = RoutingConfig(prefill_tokens_per_s=4000.0, host_load_tokens_per_s=130_000.0, overhead_s=0.05)
IDS = ("r0", "r1", "r2", "r3")


def CostPolicy(cfg: RoutingConfig = CFG) -> PolicyHarness:
    return PolicyHarness("cost", cfg)


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
    queued_s: float = 0.0,
    prefill: int = 0,
    running: int = 0,
    max_running: int = 0,
    decoding: tuple[tuple[float, int, int], ...] = (),
    rate: float = 0.0,
    util: float = 0.0,
    healthy: bool = True,
    kv: int = 0,
    pool: int = 0,
) -> Candidate:
    state = ReplicaState(
        id=rid,
        healthy=healthy,
        inflight_requests=running,
        inflight_prefill_tokens=prefill,
        inflight_prefill_s=queued_s,
        decoding=decoding,
        max_running_requests=max_running,
        arrival_rate=rate,
        utilization=util,
        kv_tokens=kv,
        gpu_tokens=pool,
    )
    return Candidate(state, PrefixMatch(gpu, host, storage))


# ---- the placement rule -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("x", "wait", "rate", "util", "expected"),
    [
        (1.5, 0.5, 2.0, 0.5, 1.5 * 2.0 * 2.0 / 0.5),  # x λ (W + x) / (1 - ρ)
        (1.5, 0.5, 0.0, 0.5, 0.0),  # nobody arrives behind it: no delay imposed
        (0.0, 9.0, 5.0, 0.9, 0.0),  # no own work (a full GPU hit): nothing imposed
        (1.0, 0.0, 1.0, 2.0, 1.0 * 1.0 * 1.0 / (1 - 0.95)),  # utilization capped at 0.95
    ],
)
def test_imposed_delay_formula(x: float, wait: float, rate: float, util: float, expected: float) -> None:
    assert imposed_delay_s(x, wait, rate, util, cap=0.95) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("holder_queue_s", "winner", "reason"),
    [
        # a hit queued behind one short prefill stays on the document's holder
        (0.5, "r0", Reason.PREFIX_GPU),
        # ...and behind a busy but not saturated queue too: a copy elsewhere would delay everyone there
        (3.0, "r0", Reason.PREFIX_GPU),
        # behind many cold prefills (the holder near saturation) it moves: the copy is worth its price
        (40.0, "r1", Reason.LEAST_COST),
    ],
)
def test_a_hit_stays_behind_a_short_queue_and_moves_behind_a_long_one(
    holder_queue_s: float, winner: str, reason: Reason
) -> None:
    busy = 0.5 + 0.4 * min(holder_queue_s / 40.0, 1.0)
    holder = cand("r0", gpu=6000, queued_s=holder_queue_s, running=4, rate=2.0, util=busy)
    other = cand("r1", queued_s=0.3, running=2, rate=1.5, util=0.5)
    d = CostPolicy().route(req(6100), [holder, other])
    assert (d.replica, d.reason) == (winner, reason)


def test_greedy_would_replicate_where_the_placement_rule_keeps_the_hit() -> None:
    """The holder's queue (2 s) is longer than a cold prefill elsewhere (1.5 s): the request's own TTFT
    is lower on the idle replica, but that replica is busy enough that a 1.5 s copy delays ~4 requests."""
    holder = cand("r0", gpu=6000, queued_s=2.0, running=3, rate=1.5, util=0.6)
    other = cand("r1", queued_s=0.0, running=1, rate=1.5, util=0.6)
    d = CostPolicy().route(req(6100), [holder, other])
    assert d.replica == "r0"
    assert d.terms.total > 0.05 + 6100 / 4000.0  # greedy would have chosen r1 (ttft 1.58 s there)


def test_decoding_requests_do_not_count_as_prefill_load() -> None:
    """r0 holds the document and runs 20 decoding requests (no prefill queued, free slots): its hits
    stay there. Only when its running slots are full does the wait for a slot count."""
    decoding = cand("r0", gpu=6000, running=20, max_running=32, rate=3.0, util=0.2)
    idle = cand("r1", rate=0.5, util=0.1)
    d = CostPolicy().route(req(6100), [decoding, idle])
    assert (d.replica, d.reason, d.terms.queue_s) == ("r0", Reason.PREFIX_GPU, 0.0)
    long_decodes = tuple((1.0, 4000, 0) for _ in range(32))  # 32 slots busy for ~28 s more
    full = cand("r0", gpu=6000, running=32, max_running=32, decoding=long_decodes, rate=3.0, util=0.2)
    d = CostPolicy().route(req(6100), [full, idle])
    assert d.replica == "r1"


@pytest.mark.parametrize(
    ("decoding", "inflight", "expected"),
    [
        (((1.0, 100, 0), (0.5, 200, 0)), 1, 0.0),  # a free slot
        (((0.5, 100, 0), (0.5, 200, 0)), 2, 100 * 0.01 - 0.5),  # full: the first to finish frees one
        (((0.2, 100, 0), (0.5, 200, 0)), 3, 200 * 0.01 - 0.5),  # one request already waits: the second
        (((9.0, 100, 0),), 2, 0.1 * 100 * 0.01),  # past its estimate: a tenth of it
        ((), 2, 64 * 0.01),  # nothing known: one default output
    ],
)
def test_slot_wait_from_the_decoding_requests(
    decoding: tuple[tuple[float, int, int], ...], inflight: int, expected: float
) -> None:
    state = ReplicaState("r", inflight_requests=inflight, max_running_requests=2, decoding=decoding)
    assert slot_wait_s(state, 0.01, 64) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("held", "decoding", "queued_s", "expected"),
    [
        (8000, ((1.0, 100, 4000),), 0.0, 0.0),  # 8000 held + 1100 needed fit in the 10000-token pool
        (9500, ((0.5, 100, 4000), (0.5, 300, 5500)), 0.0, 100 * 0.01 - 0.5),  # the first to finish frees
        (9500, ((0.5, 100, 500), (0.5, 300, 9000)), 0.0, 300 * 0.01 - 0.5),  # it frees too little: both
        (9500, ((0.5, 100, 500),), 0.2, 100 * 0.01 - 0.5),  # the rest is queued: the decoder, at least
        (9500, ((0.5, 100, 500),), 4.0, 4.0),  # ... or the queue ahead, once it is longer
        (9500, (), 0.0, 0.0),  # nothing known of the decoders: no wait beyond the queue's
    ],
)
def test_memory_wait_from_the_decoding_requests(
    held: int, decoding: tuple[tuple[float, int, int], ...], queued_s: float, expected: float
) -> None:
    state = ReplicaState(
        "r", kv_tokens=held, gpu_tokens=10_000, decoding=decoding, inflight_prefill_s=queued_s
    )
    assert memory_wait_s(state, 1100, 0.01, 64) == pytest.approx(expected)


def test_a_replica_whose_pool_its_decoders_fill_is_avoided_though_its_prefill_queue_is_empty() -> None:
    """Unique prompts on a slow-decoding fleet: r0's running requests hold its whole KV pool for ~2 s
    more and nothing is queued for prefill; r1 has half a second of prefill queued and room. The
    prompt goes to r1; without the pool's size (unknown) it would go to r0."""
    held = tuple((1.0, 1000, 2000) for _ in range(5))  # 5 x 2000 tokens, ~(1000 x 0.003 - 1) s left each
    full = cand("r0", running=5, decoding=held, kv=10_000, pool=10_000, rate=1.0, util=0.3)
    roomy = cand("r1", queued_s=0.5, running=2, kv=3000, pool=10_000, rate=1.0, util=0.3)
    cfg = RoutingConfig(prefill_tokens_per_s=4000.0, overhead_s=0.05, decode_s_per_token=0.003)
    d = CostPolicy(cfg).route(req(1000), [full, roomy])
    assert d.replica == "r1"
    unknown = cand("r0", running=5, decoding=held, kv=10_000, pool=0, rate=1.0, util=0.3)
    assert CostPolicy(cfg).route(req(1000), [unknown, roomy]).replica == "r0"


# ---- reasons and tiers ------------------------------------------------------------------------------
def test_misses_spread_over_idle_replicas_whatever_the_list_order() -> None:
    policy = CostPolicy()
    counts = Counter(policy.route(req(), [cand(r) for r in IDS]).replica for _ in range(400))
    assert set(counts) == set(IDS) and min(counts.values()) > 60
    assert policy.route(req(), [cand(r) for r in IDS]).reason is Reason.LEAST_COST


def test_misses_go_where_they_delay_the_fewest_requests() -> None:
    """No replica holds anything; r1 has the shortest queue but the most traffic arriving."""
    cands = [cand("r0", queued_s=0.4, rate=0.2, util=0.1), cand("r1", queued_s=0.2, rate=3.0, util=0.8)]
    assert CostPolicy().route(req(6000), cands).replica == "r0"


@pytest.mark.parametrize(
    ("holder", "reason"),
    [
        (cand("r1", gpu=39_000), Reason.PREFIX_GPU),
        (cand("r1", gpu=1000, host=38_000), Reason.PREFIX_HOST),
        (cand("r1", storage=38_000), Reason.PREFIX_STORAGE),
    ],
)
def test_a_cached_document_wins_from_any_tier_over_a_cold_prefill(holder: Candidate, reason: Reason) -> None:
    d = CostPolicy().route(req(40_000), [cand("r0"), holder, cand("r2")])
    assert (d.replica, d.reason) == ("r1", reason)
    assert d.match == holder.match
    assert d.terms.prefill_s == pytest.approx((40_000 - holder.match.total_tokens) / 4000.0)
    assert d.ranked[0] == "r1" and set(d.ranked) == {"r0", "r1", "r2"}


def test_host_reload_beats_a_cold_prefill_but_not_a_gpu_hit() -> None:
    d = CostPolicy().route(req(40_000), [cand("r0", host=39_000), cand("r1", gpu=39_000), cand("r2")])
    assert d.replica == "r1"
    d = CostPolicy().route(req(40_000), [cand("r0", host=39_000), cand("r2")])
    assert (d.replica, d.reason) == ("r0", Reason.PREFIX_HOST)
    assert d.terms.reload_s == pytest.approx(39_000 / 130_000.0)


def test_a_tie_broken_away_from_the_longer_prefix_is_a_fallback() -> None:
    # r0 holds one block and is marginally cheaper, but busier: within the tie tolerance load decides
    d = CostPolicy().route(req(10_000), [cand("r0", gpu=16, prefill=100), cand("r1")])
    assert (d.replica, d.reason) == ("r1", Reason.FALLBACK)


def test_unhealthy_and_draining_replicas_are_never_chosen() -> None:
    policy = CostPolicy()
    drain = Candidate(ReplicaState(id="r2", draining=True), PrefixMatch(gpu_tokens=900))
    d = policy.route(req(), [cand("r0", gpu=900, healthy=False), cand("r1"), drain])
    assert d.replica == "r1" and d.ranked == ("r1",)
    with pytest.raises(NoCandidates):
        policy.route(req(), [cand("r0", healthy=False)])


def test_observed_slow_prefill_raises_the_predicted_cost() -> None:
    policy = CostPolicy()
    before = policy.route(req(4000), [cand("r0")])
    for _ in range(30):
        d = policy.route(req(4000), [cand("r0")])
        policy.observe(req(4000), d, Report(ok=True, prompt_tokens=4000, cached_tokens=0, ttft_s=0.05 + 4.0))
    after = policy.route(req(4000), [cand("r0")])
    assert after.cost > 1.8 * before.cost


def test_decode_speed_is_learned_from_streamed_answers() -> None:
    policy = CostPolicy()
    for _ in range(40):
        d = policy.route(req(4000), [cand("r0")])
        report = Report(ok=True, prompt_tokens=4000, ttft_s=1.0, completion_tokens=200, decode_s=4.0)
        policy.observe(req(4000), d, report)
    assert policy.rates.get("r0").decode_s_per_token == pytest.approx(0.02, rel=0.05)


def test_a_shared_system_prompt_does_not_pile_onto_one_replica() -> None:
    """Closed loop with the cache model: 2K shared tokens + a unique 400-token tail per request, six
    requests prefilling at a time, load fed back in seconds and arrivals."""
    cfg = RoutingConfig(block_chars=64, chars_per_token=4.0)
    model, policy = CacheModel(cfg, 16.0), CostPolicy(cfg)
    states = {
        r: ReplicaState(id=r, gpu_tokens=200_000, host_tokens=400_000, write_policy="write_back") for r in IDS
    }
    inflight: list[tuple[str, float]] = []
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
        work = d.terms.prefill_s + d.terms.reload_s
        inflight.append((d.replica, work))
        _load(states, d.replica, work, +1)
        if len(inflight) > 6:  # requests finish their prefill in arrival order
            _load(states, *inflight.pop(0), -1)
    assert set(counts) == set(IDS)
    assert max(counts.values()) / (120 / 4) <= 1.3


def _load(states: dict[str, ReplicaState], rid: str, work: float, sign: int) -> None:
    s = states[rid]
    states[rid] = ReplicaState(
        id=rid,
        gpu_tokens=s.gpu_tokens,
        host_tokens=s.host_tokens,
        write_policy=s.write_policy,
        inflight_requests=s.inflight_requests + sign,
        inflight_prefill_s=max(0.0, s.inflight_prefill_s + sign * work),
        arrival_rate=s.arrival_rate + (0.1 if sign > 0 else 0.0),
        utilization=min(0.9, s.utilization + (0.02 if sign > 0 else 0.0)),
    )


# ---- sessions and ties ------------------------------------------------------------------------------
def test_session_sticks_while_its_replica_is_not_overloaded_and_yields_when_it_is() -> None:
    policy = CostPolicy()
    first = policy.route(req(session="s"), [cand(r) for r in IDS])
    home = first.replica
    others = [r for r in IDS if r != home]
    # the natural pick would be elsewhere (the home replica has a little queue), affinity keeps it home
    again = policy.route(req(session="s"), [cand(home, queued_s=0.1), *(cand(r) for r in others)])
    assert (again.replica, again.reason) == (home, Reason.SESSION)
    # overloaded: its cost far above 2x the best, the session moves and follows the new replica
    moved = policy.route(req(session="s"), [cand(home, queued_s=10.0), *(cand(r) for r in others)])
    assert moved.replica != home and moved.reason is Reason.LEAST_COST
    back = policy.route(req(session="s"), [cand(home), *(cand(r, queued_s=0.01) for r in others)])
    assert back.replica == moved.replica and back.reason is Reason.SESSION


def test_forgetting_a_replica_drops_its_sessions_and_rates() -> None:
    policy = CostPolicy()
    d = policy.route(req(session="s"), [cand("r0"), cand("r1")])
    policy.observe(req(), d, Report(ok=True, prompt_tokens=1000, cached_tokens=0, ttft_s=5.0))
    sessions = _sessions(policy)
    assert policy.rates.own(d.replica) is not None and sessions.sessions.get("s") == d.replica
    policy.forget(d.replica)
    assert policy.rates.own(d.replica) is None and sessions.sessions.get("s") is None


def _sessions(policy: PolicyHarness) -> SessionPicker:
    picker = policy.policy.picker
    assert isinstance(picker, SessionPicker)
    return picker


def _pick(picker: LoadTiePicker, scored: list[tuple[Candidate, float]]) -> Candidate:
    """A pick, then the Router telling the picker where the request went."""
    chosen = picker.pick(req(), [Scored(c, cost) for c, cost in scored]).chosen.cand
    picker.chose(req(), chosen.state.id)
    return chosen


def test_near_ties_go_to_the_fewest_prefill_tokens_then_least_recent_then_a_seeded_hash() -> None:
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
    assert draws == {"a": 50, "b": 50}  # never chosen: the hash; then least recent: they alternate
    twin = LoadTiePicker(seed=0, rel_tol=0.05)  # another gateway, same request: the same draw
    fresh = [Scored(cand(r), 1.0) for r in ("x", "y", "z")]
    assert (
        twin.pick(req(), fresh).chosen.id == LoadTiePicker(seed=0, rel_tol=0.05).pick(req(), fresh).chosen.id
    )


def test_requests_sharing_only_a_first_block_draw_apart_and_alike_on_every_gateway() -> None:
    """Never-chosen replicas tie: the draw depends on the whole prompt (its last block), so new
    conversations that share a system prompt spread, and two gateways draw the same for one request."""
    fresh = [Scored(cand(r), 1.0) for r in ("x", "y", "z")]
    picks = {LoadTiePicker(0, 0.05).pick(req(blocks=(1, 100 + i)), fresh).chosen.id for i in range(30)}
    assert picks == {"x", "y", "z"}
    one, other = LoadTiePicker(0, 0.05), LoadTiePicker(0, 0.05)
    assert [one.pick(req(blocks=(1, 100 + i)), fresh).chosen.id for i in range(30)] == [
        other.pick(req(blocks=(1, 100 + i)), fresh).chosen.id for i in range(30)
    ]


def _new_sessions(shared: int) -> tuple[Counter[str], Counter[Reason], PolicyHarness]:
    """40 new 4000-token sessions whose first ``shared`` tokens r0 holds (r0 stays the cheapest)."""
    policy = CostPolicy()
    counts: Counter[str] = Counter()
    reasons: Counter[Reason] = Counter()
    for i in range(40):
        d = policy.route(req(4000, session=f"s{i}"), [cand("r0", gpu=shared), *(cand(r) for r in IDS[1:])])
        counts[d.replica] += 1
        reasons[d.reason] += 1
    return counts, reasons, policy


def test_new_sessions_sharing_a_system_prompt_spread_over_the_fleet() -> None:
    """A 1000-token shared prompt: a cold start elsewhere (1.05 s) is within 2x the hit on r0 (0.80 s),
    so new sessions spread by session count."""
    counts, reasons, policy = _new_sessions(1000)
    assert set(counts) == set(IDS) and max(counts.values()) <= 1.3 * 40 / 4 + 1
    assert reasons[Reason.PREFIX_GPU] > 0 and reasons[Reason.FALLBACK] > 0
    assert _sessions(policy).sessions.held("r0") == counts["r0"]


def test_a_new_session_is_not_spread_where_its_next_turn_would_not_stay() -> None:
    """A 3500-token shared prompt: a cold start elsewhere (1.05 s) is 6x the hit on r0 (0.175 s), beyond
    the 2x a session's turns stay within; the copy is left to the placement cost (r0's queue), not to a
    count."""
    counts, reasons, _ = _new_sessions(3500)
    assert counts == {"r0": 40} and reasons[Reason.FALLBACK] == 0
