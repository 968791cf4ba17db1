"""round_robin and least_load (tokens, not request counts), and the policy factory."""

from __future__ import annotations

from collections import Counter

import pytest

from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.policies.factory import build_policy
from routing.rates import RateBook
from routing.types import Candidate, Reason, ReplicaState, RoutingRequest
from tests.routing.harness import PolicyHarness


def RoundRobinPolicy() -> PolicyHarness:
    return PolicyHarness("round_robin")


def LeastLoadPolicy(cfg: RoutingConfig) -> PolicyHarness:
    return PolicyHarness("least_load", cfg)


REQ = RoutingRequest(model="m", block_hashes=(), prompt_tokens=100, block_tokens=64.0)


def cands(*states: ReplicaState) -> list[Candidate]:
    return [Candidate(s) for s in states]


def test_round_robin_cycles_healthy_replicas_and_ranks_the_rest() -> None:
    p = RoundRobinPolicy()
    cs = cands(
        ReplicaState("b"),
        ReplicaState("a"),
        ReplicaState("c", healthy=False),
        ReplicaState("d", draining=True),
    )
    decisions = [p.route(REQ, cs) for _ in range(4)]
    assert [d.replica for d in decisions] == ["a", "b", "a", "b"]
    assert decisions[0].ranked == ("a", "b") and decisions[1].ranked == ("b", "a")
    assert {d.reason for d in decisions} == {Reason.ROUND_ROBIN}


def test_round_robin_no_candidates() -> None:
    with pytest.raises(NoCandidates):
        RoundRobinPolicy().route(REQ, cands(ReplicaState("a", healthy=False)))


@pytest.mark.parametrize(
    ("a", "b", "winner"),
    [
        # one 40K-token prefill in flight outweighs three short requests
        (
            ReplicaState("a", inflight_requests=1, inflight_prefill_tokens=40_000),
            ReplicaState("b", inflight_requests=3),
            "b",
        ),
        (
            ReplicaState("a", inflight_requests=3),
            ReplicaState("b", inflight_requests=1, inflight_prefill_tokens=40_000),
            "a",
        ),
        # equal prefill tokens: the request weight decides
        (
            ReplicaState("a", inflight_requests=2, inflight_prefill_tokens=10),
            ReplicaState("b", inflight_requests=1, inflight_prefill_tokens=10),
            "b",
        ),
        (
            ReplicaState("a", healthy=False),
            ReplicaState("b", inflight_requests=50, inflight_prefill_tokens=10**6),
            "b",
        ),
    ],
)
def test_least_load_counts_tokens(a: ReplicaState, b: ReplicaState, winner: str) -> None:
    d = LeastLoadPolicy(RoutingConfig(tokens_per_request=256)).route(REQ, cands(a, b))
    assert d.replica == winner and d.reason is Reason.LEAST_LOAD
    assert d.ranked[0] == winner


def test_least_load_breaks_ties_with_a_seeded_draw_not_list_order() -> None:
    cs = cands(ReplicaState("a"), ReplicaState("b"), ReplicaState("c"))
    picks = Counter(LeastLoadPolicy(RoutingConfig(seed=s)).route(REQ, cs).replica for s in range(60))
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) >= 10
    p1, p2 = LeastLoadPolicy(RoutingConfig(seed=3)), LeastLoadPolicy(RoutingConfig(seed=3))
    assert [p1.route(REQ, cs).replica for _ in range(10)] == [p2.route(REQ, cs).replica for _ in range(10)]


@pytest.mark.parametrize("name", ["cost", "round_robin", "least_load", "cache_aware", "consistent_hash"])
def test_factory_builds_every_policy(name: str) -> None:
    cfg = RoutingConfig(policy=name)  # type: ignore[arg-type]
    policy = build_policy(cfg, RateBook(cfg))
    choice = policy.decide(
        REQ, cands(ReplicaState("a", gpu_tokens=10_000), ReplicaState("b", gpu_tokens=10_000))
    )
    assert policy.name == name and choice.decision.replica in {"a", "b"}


def test_factory() -> None:
    cfg = RoutingConfig(policy="no_such_policy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"available: .*least_load"):
        build_policy(cfg, RateBook(cfg))
