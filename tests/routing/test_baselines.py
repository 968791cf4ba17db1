"""The baselines: sglang-style cache_aware (including its failure modes) and consistent hashing."""

from __future__ import annotations

from collections import Counter

import pytest

from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.policies.consistent_hash import rendezvous_weight
from routing.types import Candidate, Reason, ReplicaState, RoutingRequest
from tests.routing.harness import PolicyHarness

IDS = ("r0", "r1", "r2", "r3")


def req(blocks: tuple[int, ...], session: str | None = None) -> RoutingRequest:
    return RoutingRequest(
        model="m",
        block_hashes=blocks,
        prompt_tokens=16 * len(blocks) + 1,
        block_tokens=16.0,
        session_key=session,
    )


def cands(running: dict[str, int] | None = None, ids: tuple[str, ...] = IDS) -> list[Candidate]:
    running = running or {}
    return [Candidate(ReplicaState(id=r, inflight_requests=running.get(r, 0))) for r in ids]


def test_cache_aware_follows_its_own_tree_above_the_threshold() -> None:
    policy = PolicyHarness("cache_aware", RoutingConfig())
    first = policy.route(req((1, 2, 3, 4)), cands())
    assert first.reason is Reason.LEAST_LOAD
    again = policy.route(req((1, 2, 3, 4, 5)), cands({first.replica: 3}))
    assert (again.replica, again.reason) == (first.replica, Reason.CACHE_MATCH)
    assert again.cost == 0.0  # 4 of 5 blocks match: the holder of the best run costs nothing
    low = policy.route(req((1, 9, 9, 9)), cands({first.replica: 3}))  # 1/4 = 0.25 <= 0.3
    assert low.reason is Reason.LEAST_LOAD and low.replica != first.replica


def test_cache_aware_balance_escape_needs_both_thresholds() -> None:
    policy = PolicyHarness("cache_aware", RoutingConfig())
    home = policy.route(req((1, 2)), cands()).replica
    other = next(r for r in IDS if r != home)
    below_abs = {home: 64, **{r: 1 for r in IDS if r != home}}  # gap 63: no escape
    assert policy.route(req((1, 2)), cands(below_abs)).reason is Reason.CACHE_MATCH
    imbalanced = {home: 100, **{r: 10 for r in IDS if r != home}}
    imbalanced[other] = 5
    d = policy.route(req((1, 2)), cands(imbalanced))
    assert (d.replica, d.reason) == (other, Reason.BALANCE)


def test_cache_aware_piles_a_shared_system_prompt_onto_one_replica() -> None:
    """The peer's failure mode reproduced: every request matches the shared prefix above 0.3."""
    policy = PolicyHarness("cache_aware", RoutingConfig())
    shared = tuple(range(100))
    counts = Counter(policy.route(req((*shared, 10_000 + i)), cands()).replica for i in range(50))
    assert len(counts) == 1


def test_cache_aware_misses_spread_by_seeded_draw_and_no_healthy_replica_raises() -> None:
    policy = PolicyHarness("cache_aware", RoutingConfig(seed=3))
    counts = Counter(policy.route(req((i,)), cands()).replica for i in range(1, 200))
    assert set(counts) == set(IDS)
    with pytest.raises(NoCandidates):
        policy.route(req((1,)), [Candidate(ReplicaState(id="x", healthy=False))])


def test_cache_aware_tree_is_bounded_per_replica() -> None:
    policy = PolicyHarness("cache_aware", RoutingConfig(block_chars=256, cache_aware_max_tree_chars=256 * 64))
    for i in range(20):
        policy.route(req(tuple(range(i * 100, i * 100 + 50))), cands(ids=("r0",)))
    assert policy.route(req(tuple(range(50))), cands(ids=("r0",))).reason is Reason.LEAST_LOAD


def test_consistent_hash_keeps_sessions_and_moves_only_the_removed_replicas_keys() -> None:
    policy = PolicyHarness("consistent_hash", RoutingConfig())
    before = {f"s{i}": policy.route(req((i,), f"s{i}"), cands()).replica for i in range(400)}
    assert all(policy.route(req((7,), k), cands()).replica == r for k, r in list(before.items())[:50])
    counts = Counter(before.values())
    assert min(counts.values()) > 60
    after = {k: policy.route(req((1,), k), cands(ids=IDS[:3])).replica for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k, r in before.items() if r == "r3"}
    d = policy.route(req((1,), "s1"), cands())
    assert d.reason is Reason.CONSISTENT_HASH and set(d.ranked) == set(IDS)


def test_consistent_hash_uses_the_first_block_without_a_session_else_a_seeded_draw() -> None:
    policy = PolicyHarness("consistent_hash", RoutingConfig())
    same = {policy.route(req((42, i)), cands()).replica for i in range(20)}
    assert len(same) == 1
    weights = {r: rendezvous_weight(b"b:" + (42).to_bytes(8, "little"), r) for r in IDS}
    assert same == {max(weights, key=lambda r: weights[r])}
    drawn = Counter(policy.route(req(()), cands()).replica for _ in range(200))
    assert set(drawn) == set(IDS)
