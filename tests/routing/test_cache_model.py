"""Table tests of the cache model: tiers per write policy, restarts, budget, corrections, accuracy."""

from __future__ import annotations

import pytest

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.pipeline import Outcome
from routing.tiers import tier_warnings
from routing.types import Decision, Reason, ReplicaState, RoutingRequest, WritePolicy

BT = 16.0  # tokens per block: block_chars 64 / 4 chars per token
CFG = RoutingConfig(block_chars=64, chars_per_token=4.0)


def doc(n: int, blocks: int = 8) -> RoutingRequest:
    hashes = tuple(range(n * 1000, n * 1000 + blocks))
    return RoutingRequest(model="m", block_hashes=hashes, prompt_tokens=int(blocks * BT) + 5, block_tokens=BT)


def replica(
    rid: str = "a",
    policy: WritePolicy | None = "write_back",
    *,
    hybrid: bool = False,
    started_at: float = 1.0,
    gpu: int = 10,
    host: int = 40,
    storage: int = 0,
) -> ReplicaState:
    return ReplicaState(
        id=rid,
        gpu_tokens=int(gpu * BT),
        host_tokens=int(host * BT),
        storage_tokens=int(storage * BT),
        write_policy=policy,
        hybrid=hybrid,
        started_at=started_at,
    )


def serve(model: CacheModel, req: RoutingRequest, rid: str = "a") -> Decision:
    decision = Decision(replica=rid, reason=Reason.LEAST_COST)
    model.record(req, decision)
    return decision


def probe(policy: WritePolicy | None, hybrid: bool = False) -> tuple[float, float]:
    """The seeds' probe on one replica: document R, eviction pressure, then R again: (gpu, host) match."""
    model = CacheModel(CFG)
    state = replica(policy=policy, hybrid=hybrid)
    model.sync([state])
    serve(model, doc(1))
    for n in range(2, 5):
        serve(model, doc(n))
    m = model.match(doc(1), [state])["a"]
    return m.gpu_tokens, m.host_tokens


@pytest.mark.parametrize(
    ("policy", "hybrid", "host_blocks"),
    [
        ("write_back", False, 8),  # demoted on GPU eviction: a host reload
        ("write_through", False, 8),  # copied at insert
        ("write_through_selective", False, 8),  # served once = two hits (after prefill, at finish)
        (None, False, 0),  # HiCache off: dropped
        ("write_back", True, 8),  # hybrid + write_back reuses host (the seeds' fix)
        ("write_through", True, 0),  # hybrid + write_through: host copies are not reusable (the trap)
    ],
)
def test_a_document_evicted_from_gpu_is_found_in_host_only_where_sglang_reuses_it(
    policy: WritePolicy | None, hybrid: bool, host_blocks: int
) -> None:
    assert probe(policy, hybrid) == (0.0, host_blocks * BT)


def test_selective_backs_up_a_served_request_and_host_hits_are_promoted() -> None:
    model = CacheModel(CFG)
    state = replica(policy="write_through_selective")
    model.sync([state])
    serve(model, doc(1))  # SGLang counts two hits for one served request: the node is backed up
    tiers = model.tiers("a")
    assert tiers is not None and len(tiers.host) == 8
    serve(model, doc(1))
    assert len(tiers.host) == 8
    serve(model, doc(2))
    serve(model, doc(3))  # doc 1 leaves the GPU; its host copy remains
    assert model.match(doc(1), [state])["a"].host_tokens == 8 * BT
    serve(model, doc(1))  # loaded back: on GPU again, host copy kept
    m = model.match(doc(1), [state])["a"]
    assert (m.gpu_tokens, m.host_tokens) == (8 * BT, 0.0) and len(tiers.host) >= 8


def test_storage_tier_keeps_what_host_dropped_and_survives_a_restart() -> None:
    model = CacheModel(CFG)
    state = replica(policy="write_back", gpu=10, host=10, storage=100)
    model.sync([state])
    for n in range(1, 6):
        serve(model, doc(n, blocks=20))
    m = model.match(doc(1, blocks=20), [state])["a"]
    assert m.storage_tokens == 20 * BT and m.gpu_tokens == 0 and m.host_tokens == 0
    restarted = replica(policy="write_back", gpu=10, host=10, storage=100, started_at=2.0)
    tiers = model.tiers("a")
    assert tiers is not None and len(tiers.gpu) == 10
    after = model.match(doc(1, blocks=20), [restarted])["a"]
    assert after.storage_tokens == 20 * BT
    assert len(tiers.gpu) == 0 and len(tiers.host) == 0 and len(tiers.storage) == 90


def test_restart_forgets_gpu_and_host_and_a_new_start_time_of_zero_is_not_a_restart() -> None:
    model = CacheModel(CFG)
    model.sync([replica()])
    serve(model, doc(1))
    assert model.match(doc(1), [replica(started_at=0.0)])["a"].gpu_tokens == 8 * BT
    model.sync([replica(started_at=1.0)])
    assert model.match(doc(1), [replica(started_at=2.0)])["a"].total_tokens == 0


def test_restart_and_flush_keep_storage_forget_drops_everything() -> None:
    """``restart`` (a restart the fleet saw, a cache flush) is the same as a new start time; ``forget``
    (the replica left) keeps nothing."""
    model = CacheModel(CFG)
    state = replica(policy="write_back", gpu=10, host=10, storage=100)
    model.sync([state])
    for n in range(1, 6):
        serve(model, doc(n, blocks=20))
    assert model.match(doc(5, blocks=20), [state])["a"].gpu_tokens == 10 * BT
    assert model.match(doc(1, blocks=20), [state])["a"].storage_tokens == 20 * BT
    model.restart("a")
    assert model.match(doc(5, blocks=20), [state])["a"].total_tokens == 0  # its GPU + host copy is gone
    after = model.match(doc(1, blocks=20), [state])["a"]
    assert (after.gpu_tokens, after.host_tokens, after.storage_tokens) == (0, 0, 20 * BT)
    model.restart("unknown")  # a replica the model never saw: nothing to do
    model.forget("a")
    assert model.match(doc(1, blocks=20), [state])["a"].total_tokens == 0


def test_match_caps_at_prompt_minus_one_and_ignores_tiny_host_runs() -> None:
    model = CacheModel(CFG)
    state = replica()
    model.sync([state])
    req = doc(1)
    serve(model, req)
    exact = RoutingRequest(
        model="m", block_hashes=req.block_hashes, prompt_tokens=int(8 * BT), block_tokens=BT
    )
    assert model.match(exact, [state])["a"].gpu_tokens == 8 * BT - 1
    tiny = RoutingRequest(model="m", block_hashes=(5, 6), prompt_tokens=100, block_tokens=4.0)
    serve(model, tiny)
    for n in range(2, 5):
        serve(model, doc(n))
    assert model.tiers("a") is not None and 5 in model.tiers("a").host  # type: ignore[union-attr]
    assert model.match(tiny, [state])["a"].total_tokens == 0  # 8 tokens < SGLang's load-back threshold


def test_global_budget_scales_every_replica_and_forget_frees_its_blocks() -> None:
    model = CacheModel(RoutingConfig(block_chars=64, chars_per_token=4.0, model_budget_blocks=60))
    states = [replica("a", gpu=40, host=40), replica("b", gpu=40, host=40)]
    model.sync(states)
    for n in range(1, 30):
        serve(model, doc(n), "a" if n % 2 else "b")
    assert 0 < model.blocks() <= 60
    before = model.blocks()
    a = model.tiers("a")
    held = a.blocks() if a else 0
    model.forget("a")
    assert model.tiers("a") is None and model.blocks() == before - held


def test_unknown_replicas_are_added_from_the_snapshot_given_to_match() -> None:
    model = CacheModel(CFG)
    assert model.match(doc(1), [replica("z")])["z"].total_tokens == 0
    serve(model, doc(1), "z")
    assert model.match(doc(1), [replica("z")])["z"].gpu_tokens == 8 * BT


def outcome(req: RoutingRequest, decision: Decision, cached: int) -> Outcome:
    return Outcome(
        request=req, decision=decision, ok=True, prompt_tokens=req.prompt_tokens, cached_tokens=cached
    )


def test_optimistic_predictions_shrink_the_capacity_and_pessimistic_ones_grow_it_back() -> None:
    model = CacheModel(CFG)
    state = replica(gpu=40)
    model.sync([state])
    cold = doc(1)
    first = serve(model, cold)
    model.observe(outcome(cold, first, 0))  # a cold request: predicted 0, actual 0
    req = doc(1)
    second = serve(model, req)  # predicted: all 8 blocks on GPU
    model.observe(outcome(req, second, 0))  # the replica had evicted them
    stats = model.accuracy()["a"]
    assert stats.requests == 2 and stats.gpu_factor < 1.0
    assert stats.mean_abs_error_tokens == pytest.approx((8 * BT) / 2)
    assert stats.error_ratio == pytest.approx(8 * BT / (2 * req.prompt_tokens))
    tiers = model.tiers("a")
    assert tiers is not None and tiers.gpu.capacity < 40
    shrunk = stats.gpu_factor
    other = doc(2)
    third = serve(model, other)
    model.observe(outcome(other, third, int(8 * BT)))  # predicted cold, actually cached: grow back
    assert shrunk < model.accuracy()["a"].gpu_factor <= 1.0


def test_prefixes_still_in_flight_do_not_count_as_model_errors() -> None:
    model = CacheModel(CFG)
    model.sync([replica(gpu=40)])
    a, b = doc(1), doc(1)
    da = serve(model, a)  # a is still prefilling when b arrives
    db = serve(model, b)
    model.observe(outcome(b, db, 0))  # b found nothing: a's blocks were not in the tree yet
    model.observe(outcome(a, da, 0))
    stats = model.accuracy()["a"]
    assert stats.gpu_factor == 1.0 and stats.requests == 2
    c = doc(1)
    dc = serve(model, c)  # now nothing is provisional: the same miss is a real error
    model.observe(outcome(c, dc, 0))
    assert model.accuracy()["a"].gpu_factor < 1.0


def test_outcomes_without_a_record_or_cached_tokens_are_ignored() -> None:
    model = CacheModel(CFG)
    model.sync([replica()])
    req = doc(1)
    d = serve(model, req)
    model.observe(Outcome(request=doc(1), decision=d, ok=True, cached_tokens=0))  # a different request object
    model.observe(Outcome(request=req, decision=d, ok=False))
    assert model.accuracy() == {}


def test_a_retry_on_another_replica_rolls_the_first_record_back() -> None:
    model = CacheModel(CFG)
    states = [replica("a", gpu=40), replica("b", gpu=40)]
    model.sync(states)
    req = doc(1)
    serve(model, req, "a")  # the first attempt failed before any byte...
    retry = serve(model, req, "b")  # ...and was retried on b
    model.observe(outcome(req, retry, 0))
    m = model.match(doc(1), states)
    assert m["a"].total_tokens == 0 and m["b"].gpu_tokens == 8 * BT
    assert set(model.accuracy()) == {"b"}


def test_a_request_that_failed_before_its_first_byte_is_rolled_back_but_not_one_that_streamed() -> None:
    model = CacheModel(CFG)
    state = replica(gpu=40)
    model.sync([state])
    failed = doc(1)
    d = serve(model, failed)
    model.observe(Outcome(request=failed, decision=d, ok=False))
    assert model.match(doc(1), [state])["a"].total_tokens == 0
    broken = doc(2)
    d = serve(model, broken)
    model.observe(Outcome(request=broken, decision=d, ok=False, ttft_s=0.3))  # failed mid-stream
    assert model.match(doc(2), [state])["a"].gpu_tokens == 8 * BT


def test_operators_are_warned_about_tiers_that_cannot_be_reused() -> None:
    assert tier_warnings(replica(policy="write_back")) == ()
    assert "HiCache is off" in tier_warnings(replica(policy=None))[0]
    assert "hybrid" in tier_warnings(replica(policy="write_through", hybrid=True))[0]
    assert tier_warnings(replica(policy="write_back", hybrid=True)) == ()


def test_a_wrong_chars_per_token_guess_is_learned_and_not_mistaken_for_evictions() -> None:
    """The engine counts 1.6x the tokens we estimate: capacities in blocks shrink by 1.6, predictions
    that come true (in engine tokens) do not shrink the capacity factor, and accuracy is in engine tokens."""
    model = CacheModel(CFG)
    state = replica(gpu=80)
    model.sync([state])
    tiers = model.tiers("a")
    assert tiers is not None and tiers.gpu.capacity == 80
    for n in range(40):
        r = doc(1) if n % 2 else doc(2)
        predicted = model.match(r, [state])["a"].total_tokens  # what record() will predict
        d = serve(model, r)
        reported = int(r.prompt_tokens * 1.6)
        cached = min(reported - 1, int(predicted * 1.6))  # the prediction comes true, in engine tokens
        model.observe(Outcome(request=r, decision=d, ok=True, prompt_tokens=reported, cached_tokens=cached))
    assert tiers.gpu.capacity == pytest.approx(80 / 1.6, abs=3)
    stats = model.accuracy()["a"]
    assert stats.gpu_factor == 1.0
    assert stats.error_ratio < 0.05
