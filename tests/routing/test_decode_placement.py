"""routing.decode_placement: the decode server of a pair, by its formula term by term, and its ranking."""

from __future__ import annotations

import pytest

from routing.config import RoutingConfig
from routing.decode_placement import DecodePlacement
from routing.pipeline import NoCandidates
from routing.ttft import memory_wait_s
from routing.types import ReplicaState

CFG = RoutingConfig(kv_bytes_per_token=100_000, kv_transfer_gb_s=10.0, decode_s_per_token=0.01)


def decode(name: str, **kw: object) -> ReplicaState:
    base: dict[str, object] = {"gpu_tokens": 100_000, "max_running_requests": 8}
    return ReplicaState(id=name, **(base | kw))  # type: ignore[arg-type]


def test_the_cost_is_wait_plus_transfer_plus_decode() -> None:
    place = DecodePlacement(CFG)
    idle = place.cost(decode("a"), 1000, 100)
    assert idle.wait_s == 0.0
    assert idle.transfer_s == pytest.approx(1000 * 100_000 / 10e9)  # 10 ms
    assert idle.decode_s == pytest.approx(100 * 0.01)
    busy = place.cost(decode("b", inflight_requests=5, inflight_prefill_tokens=3000), 1000, 100)
    assert busy.transfer_s == pytest.approx(4000 * 100_000 / 10e9)  # behind the KV still on its way
    assert busy.decode_s == pytest.approx(100 * 0.01 * (1 + 0.08 * 5))
    assert busy.total == pytest.approx(busy.wait_s + busy.transfer_s + busy.decode_s)
    unbounded = place.cost(decode("c"), 1000, None)
    assert unbounded.decode_s == pytest.approx(CFG.default_new_tokens * 0.01)


def test_a_full_memory_pool_is_a_wait_for_the_decoding_requests_to_free_it() -> None:
    place = DecodePlacement(CFG)
    full = decode(
        "a", inflight_requests=2, kv_tokens=99_000, decoding=((0.5, 200, 60_000), (0.1, 400, 39_000))
    )
    cost = place.cost(full, 2000, 100)
    assert (
        cost.wait_s
        == pytest.approx(memory_wait_s(full, 2000 + CFG.decode_reserved_tokens, 0.01, CFG.default_new_tokens))
        and cost.wait_s > 0
    )
    assert cost.wait_s == pytest.approx(200 * 0.01 - 0.5)  # the first decoder to finish frees enough


def test_the_least_loaded_decode_wins_and_the_rest_follow_by_cost() -> None:
    place = DecodePlacement(CFG)
    states = [decode("busy", inflight_requests=6), decode("idle"), decode("some", inflight_requests=2)]
    assert [c.replica for c in place.rank(states, 500, 200)] == ["idle", "some", "busy"]


def test_unhealthy_and_draining_decodes_are_never_chosen() -> None:
    place = DecodePlacement(CFG)
    states = [
        decode("down", healthy=False),
        decode("draining", draining=True),
        decode("ok", inflight_requests=7),
    ]
    assert [c.replica for c in place.rank(states, 500, 200)] == ["ok"]
    with pytest.raises(NoCandidates):
        place.rank(states[:2], 500, 200)


def test_ties_are_drawn_by_the_seed() -> None:
    states = [decode(n) for n in "abcd"]
    picks = [DecodePlacement(CFG).rank(states, 500, 200)[0].replica for _ in range(2)]
    assert picks[0] == picks[1]  # the same seed, the same draw
    place = DecodePlacement(CFG)
    assert len({place.rank(states, 500, 200)[0].replica for _ in range(40)}) > 1  # idle decodes share
