"""Table tests of the cache model: tiers per write policy, restarts, budget, corrections, accuracy."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.ledger import Recorded
from routing.tiers import tier_warnings
from routing.types import NO_MATCH, PrefixMatch, ReplicaState, Report, RoutingRequest, WritePolicy

BT = 16.0  # tokens per block: block_chars 64 / 4 chars per token
CFG = RoutingConfig(block_chars=64, chars_per_token=4.0)


def new_model(cfg: RoutingConfig = CFG) -> CacheModel:
    return CacheModel(cfg, cfg.block_chars / cfg.chars_per_token)


def match(model: CacheModel, req: RoutingRequest, states: Sequence[ReplicaState]) -> dict[str, PrefixMatch]:
    """What the Router does: sync the snapshot once, then match (replicas without a match: NO_MATCH)."""
    model.sync(states)
    found = model.match(req, states)
    return {s.id: found.get(s.id, NO_MATCH) for s in states}


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


def serve(model: CacheModel, req: RoutingRequest, rid: str = "a") -> Recorded:
    rec = model.record(req, rid)
    assert rec is not None
    return rec


def probe(policy: WritePolicy | None, hybrid: bool = False) -> tuple[float, float]:
    """The seeds' probe on one replica: document R, eviction pressure, then R again: (gpu, host) match."""
    model = new_model()
    state = replica(policy=policy, hybrid=hybrid)
    model.sync([state])
    serve(model, doc(1))
    for n in range(2, 5):
        serve(model, doc(n))
    m = match(model, doc(1), [state])["a"]
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
    model = new_model()
    state = replica(policy="write_through_selective")
    model.sync([state])
    serve(model, doc(1))  # SGLang counts two hits for one served request: the node is backed up
    tiers = model.tiers("a")
    assert tiers is not None and len(tiers.host) == 8
    serve(model, doc(1))
    assert len(tiers.host) == 8
    serve(model, doc(2))
    serve(model, doc(3))  # doc 1 leaves the GPU; its host copy remains
    assert match(model, doc(1), [state])["a"].host_tokens == 8 * BT
    serve(model, doc(1))  # loaded back: on GPU again, host copy kept
    m = match(model, doc(1), [state])["a"]
    assert (m.gpu_tokens, m.host_tokens) == (8 * BT, 0.0) and len(tiers.host) >= 8


def test_storage_tier_keeps_what_host_dropped_and_survives_a_restart() -> None:
    model = new_model()
    state = replica(policy="write_back", gpu=10, host=10, storage=100)
    model.sync([state])
    for n in range(1, 6):
        serve(model, doc(n, blocks=20))
    m = match(model, doc(1, blocks=20), [state])["a"]
    assert m.storage_tokens == 20 * BT and m.gpu_tokens == 0 and m.host_tokens == 0
    restarted = replica(policy="write_back", gpu=10, host=10, storage=100, started_at=2.0)
    tiers = model.tiers("a")
    assert tiers is not None and len(tiers.gpu) == 10
    after = match(model, doc(1, blocks=20), [restarted])["a"]
    assert after.storage_tokens == 20 * BT
    assert len(tiers.gpu) == 0 and len(tiers.host) == 0 and len(tiers.storage) == 90


def test_restart_forgets_gpu_and_host_and_a_new_start_time_of_zero_is_not_a_restart() -> None:
    model = new_model()
    model.sync([replica()])
    serve(model, doc(1))
    assert match(model, doc(1), [replica(started_at=0.0)])["a"].gpu_tokens == 8 * BT
    model.sync([replica(started_at=1.0)])
    assert match(model, doc(1), [replica(started_at=2.0)])["a"].total_tokens == 0


def test_restart_and_flush_keep_storage_forget_drops_everything() -> None:
    """``restart`` (a restart the fleet saw, a cache flush) is the same as a new start time; ``forget``
    (the replica left) keeps nothing."""
    model = new_model()
    state = replica(policy="write_back", gpu=10, host=10, storage=100)
    model.sync([state])
    for n in range(1, 6):
        serve(model, doc(n, blocks=20))
    assert match(model, doc(5, blocks=20), [state])["a"].gpu_tokens == 10 * BT
    assert match(model, doc(1, blocks=20), [state])["a"].storage_tokens == 20 * BT
    model.restart("a")
    assert match(model, doc(5, blocks=20), [state])["a"].total_tokens == 0  # its GPU + host copy is gone
    after = match(model, doc(1, blocks=20), [state])["a"]
    assert (after.gpu_tokens, after.host_tokens, after.storage_tokens) == (0, 0, 20 * BT)
    model.restart("unknown")  # a replica the model never saw: nothing to do
    model.forget("a")
    assert match(model, doc(1, blocks=20), [state])["a"].total_tokens == 0


def test_match_caps_at_prompt_minus_one_and_ignores_tiny_host_runs() -> None:
    model = new_model()
    state = replica()
    model.sync([state])
    req = doc(1)
    serve(model, req)
    exact = RoutingRequest(
        model="m", block_hashes=req.block_hashes, prompt_tokens=int(8 * BT), block_tokens=BT
    )
    assert match(model, exact, [state])["a"].gpu_tokens == 8 * BT - 1
    tiny = RoutingRequest(model="m", block_hashes=(5, 6), prompt_tokens=100, block_tokens=4.0)
    serve(model, tiny)
    for n in range(2, 5):
        serve(model, doc(n))
    assert model.tiers("a") is not None and 5 in model.tiers("a").host  # type: ignore[union-attr]
    assert match(model, tiny, [state])["a"].total_tokens == 0  # 8 tokens < SGLang's load-back threshold


def test_global_budget_scales_every_replica_and_forget_frees_its_blocks() -> None:
    model = new_model(RoutingConfig(block_chars=64, chars_per_token=4.0, model_budget_blocks=60))
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


def test_unknown_replicas_are_added_from_the_snapshot_they_appear_in() -> None:
    model = new_model()
    assert model.record(doc(1), "z") is None  # not synced yet: nothing to record on
    assert match(model, doc(1), [replica("z")])["z"].total_tokens == 0
    serve(model, doc(1), "z")
    assert match(model, doc(1), [replica("z")])["z"].gpu_tokens == 8 * BT


def settle(model: CacheModel, rec: Recorded, cached: int) -> None:
    model.settle(rec, Report(ok=True, prompt_tokens=rec.request.prompt_tokens, cached_tokens=cached))


def test_optimistic_predictions_shrink_the_capacity_and_pessimistic_ones_grow_it_back() -> None:
    model = new_model()
    state = replica(gpu=40)
    model.sync([state])
    settle(model, serve(model, doc(1)), 0)  # a cold request: predicted 0, actual 0
    req = doc(1)
    settle(model, serve(model, req), 0)  # predicted: all 8 blocks on GPU; the replica had evicted them
    stats = model.accuracy()["a"]
    assert stats.requests == 2 and stats.gpu_factor < 1.0
    assert stats.mean_abs_error_tokens == pytest.approx((8 * BT) / 2)
    assert stats.error_ratio == pytest.approx(8 * BT / (2 * req.prompt_tokens))
    tiers = model.tiers("a")
    assert tiers is not None and tiers.gpu.capacity < 40 * BT
    shrunk = stats.gpu_factor
    settle(model, serve(model, doc(2)), int(8 * BT))  # predicted cold, actually cached: grow back
    assert shrunk < model.accuracy()["a"].gpu_factor <= 1.0


def test_prefixes_still_in_flight_do_not_count_as_model_errors() -> None:
    model = new_model()
    model.sync([replica(gpu=40)])
    ra = serve(model, doc(1))  # a is still prefilling when b arrives
    rb = serve(model, doc(1))
    settle(model, rb, 0)  # b found nothing: a's blocks were not in the tree yet
    settle(model, ra, 0)
    stats = model.accuracy()["a"]
    assert stats.gpu_factor == 1.0 and stats.requests == 2
    settle(model, serve(model, doc(1)), 0)  # now nothing is provisional: the same miss is a real error
    assert model.accuracy()["a"].gpu_factor < 1.0


def test_reports_without_cached_tokens_or_from_requests_that_never_ran_teach_nothing() -> None:
    model = new_model()
    model.sync([replica()])
    model.settle(serve(model, doc(1)), Report(ok=True, ttft_s=0.1))  # ran, but no cached-token report
    model.settle(serve(model, doc(2)), Report(ok=False))  # never ran
    assert model.accuracy() == {}


def test_a_retry_on_another_replica_rolls_the_first_record_back() -> None:
    model = new_model()
    states = [replica("a", gpu=40), replica("b", gpu=40)]
    model.sync(states)
    req = doc(1)
    model.settle(serve(model, req, "a"), Report(ok=False))  # the first attempt failed before any byte...
    settle(model, serve(model, req, "b"), 0)  # ...and was retried on b
    m = match(model, doc(1), states)
    assert m["a"].total_tokens == 0 and m["b"].gpu_tokens == 8 * BT
    assert set(model.accuracy()) == {"b"}


def test_a_rollback_keeps_blocks_another_request_in_flight_will_compute() -> None:
    """Two requests share a document on one replica; the first fails before its first byte while the
    second (which extends it) is still in flight: the document stays, because the second computes it;
    rolled back too, nothing is left. One that ran confirms its blocks for good."""
    model = new_model()
    state = replica(gpu=40)
    model.sync([state])
    short, longer = doc(1, blocks=8), doc(1, blocks=12)
    first, second = serve(model, short), serve(model, longer)
    model.settle(first, Report(ok=False))
    assert match(model, longer, [state])["a"].gpu_tokens == 12 * BT
    model.settle(second, Report(ok=False))
    assert match(model, longer, [state])["a"].total_tokens == 0
    ran, again = serve(model, short), serve(model, longer)
    model.settle(ran, Report(ok=True, ttft_s=0.2))
    model.settle(again, Report(ok=False))  # only the 4 blocks it alone added leave
    assert match(model, longer, [state])["a"].gpu_tokens == 8 * BT


def test_a_request_that_failed_before_its_first_byte_is_rolled_back_but_not_one_that_streamed() -> None:
    model = new_model()
    state = replica(gpu=40)
    model.sync([state])
    model.settle(serve(model, doc(1)), Report(ok=False))
    assert match(model, doc(1), [state])["a"].total_tokens == 0
    model.settle(serve(model, doc(2)), Report(ok=False, ttft_s=0.3))  # failed mid-stream
    assert match(model, doc(2), [state])["a"].gpu_tokens == 8 * BT


def test_operators_are_warned_about_tiers_that_cannot_be_reused() -> None:
    assert tier_warnings(replica(policy="write_back")) == ()
    assert "HiCache is off" in tier_warnings(replica(policy=None))[0]
    assert "hybrid" in tier_warnings(replica(policy="write_through", hybrid=True))[0]
    assert tier_warnings(replica(policy="write_back", hybrid=True)) == ()


def test_capacities_are_engine_tokens_whatever_the_tokens_per_block() -> None:
    """A block weighs its request's tokens per block: the 1280-token GPU pool holds 80 blocks of 16
    tokens (text) or 40 blocks of 32 (a token-id prompt packs more tokens into its bytes), never more."""
    model = new_model()
    model.sync([replica(gpu=80)])
    tiers = model.tiers("a")
    assert tiers is not None and tiers.gpu.capacity == 80 * BT
    serve(model, doc(1, blocks=80))
    assert len(tiers.gpu) == 80 and tiers.gpu.tokens == 80 * BT
    ids = RoutingRequest(
        model="m", block_hashes=tuple(range(5000, 5050)), prompt_tokens=1601, block_tokens=32.0
    )
    serve(model, ids)
    assert tiers.gpu.tokens <= 80 * BT  # 1600 tokens do not fit: the text went, then its own tail
    assert [b for b in range(5000, 5050) if b in tiers.gpu] == list(range(5000, 5040))
    assert not any(b in tiers.gpu for b in doc(1, blocks=80).block_hashes)
