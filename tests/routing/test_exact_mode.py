"""Exact mode of the cache model: KV events are the truth on their tiers (routing.exact)."""

from __future__ import annotations

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.exact import GRACE_S
from routing.hashing import token_block_hashes
from routing.kv_events import AllBlocksCleared, EventBatch, KvEvent
from routing.types import NO_MATCH, PrefixMatch, ReplicaState, Report, RoutingRequest, WritePolicy
from tests.routing.kv_pages import batch, ids, removed, stored

CFG = RoutingConfig(token_block=64)
B = 64.0


def model_with(
    policy: WritePolicy | None = "write_back", gpu_blocks: int = 8, host_blocks: int = 32
) -> tuple[CacheModel, ReplicaState]:
    model = CacheModel(CFG, B)
    state = ReplicaState(
        "a",
        gpu_tokens=int(gpu_blocks * B),
        host_tokens=int(host_blocks * B),
        page_size=16,
        write_policy=policy,
    )
    model.sync([state])
    return model, state


def req(tokens: tuple[int, ...], tenant: str = "", exact: bool = True) -> RoutingRequest:
    hashes = token_block_hashes("m", tokens, tenant, 64, 100)
    return RoutingRequest("m", hashes, len(tokens), B, tenant=tenant, exact_keys=exact)


def feed(model: CacheModel, events: list[KvEvent], encoding: str = "map", ts: float = 1.0) -> None:
    assert model.apply_kv_events("a", batch(events, encoding, ts=ts), "m")


def pass_grace(model: CacheModel, encoding: str = "map", start: float = 10.0) -> None:
    """Unrelated batches at ``start`` and ``GRACE_S`` later: keys confirmed before are due then."""
    feed(model, [*stored(ids(64, 9000), 500)], encoding, start)
    feed(model, [*stored(ids(64, 9100), 510)], encoding, start + GRACE_S)


def found(model: CacheModel, state: ReplicaState, r: RoutingRequest) -> PrefixMatch:
    return model.match(r, [state]).get("a", NO_MATCH)


DOC = ids(256 + 1)  # 4 full blocks and one more token


def test_events_alone_make_the_match_exact() -> None:
    model, state = model_with()
    assert found(model, state, req(DOC)) == NO_MATCH
    feed(model, [*stored(DOC[:192], 0)])  # another client's request: 3 blocks on GPU
    assert found(model, state, req(DOC)) == PrefixMatch(192.0, 0.0, 0.0)
    feed(model, [removed(0, 8, 4)])  # the engine evicted the deepest block
    assert found(model, state, req(DOC)) == PrefixMatch(128.0, 0.0, 0.0)
    assert model.kv_mode("a").mode == "exact"
    assert model.kv_mode("a").events == 2


def test_in_flight_blocks_are_seen_before_their_events_and_dropped_when_none_come() -> None:
    model, state = model_with()
    feed(model, [])
    r = req(DOC)
    rec = model.record(r, "a")
    assert rec is not None
    assert found(model, state, r).total_tokens == 256.0  # the next request sees the in-flight blocks
    model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    assert found(model, state, r).total_tokens == 256.0  # waiting for their BlockStored
    feed(model, [*stored(DOC[:128], 0)], ts=2.0)  # the engine stored two of the four blocks
    feed(model, [*stored(ids(64, 9000), 500)], ts=2.0 + GRACE_S - 0.1)
    assert found(model, state, r).total_tokens == 256.0  # their last pages may still come
    feed(model, [*stored(ids(64, 9100), 510)], ts=2.0 + GRACE_S)
    assert found(model, state, r) == PrefixMatch(128.0, 0.0, 0.0)


def test_text_prompts_on_an_exact_replica_stay_learned() -> None:
    model, state = model_with()
    feed(model, [])
    text = RoutingRequest("m", (11, 12, 13), 200, B)  # character-keyed: no event can name it
    rec = model.record(text, "a")
    assert rec is not None
    model.settle(rec, Report(ok=True, prompt_tokens=200, cached_tokens=0))
    pass_grace(model)
    assert found(model, state, text).total_tokens == 3 * B


def test_0_5_23_tiers_follow_gpu_and_cpu_pinned_exactly() -> None:
    model, state = model_with(gpu_blocks=100)
    feed(model, [*stored(DOC[:256], 0), *stored(DOC[:256], 0, medium="CPU_PINNED")])
    feed(model, [removed(0, 8, 8)])  # blocks 2 and 3 leave the GPU, their host copies stay
    assert found(model, state, req(DOC)) == PrefixMatch(128.0, 128.0, 0.0)
    feed(model, [removed(0, 12, 4, "CPU_PINNED")])
    assert found(model, state, req(DOC)) == PrefixMatch(128.0, 64.0, 0.0)


def test_0_5_10_stored_means_gpu_or_host_and_removed_gone_from_both() -> None:
    model, state = model_with(gpu_blocks=2)  # the GPU/host split is the LRU guess: 2 blocks fit
    feed(model, [*stored(DOC[:256], 0)], "array")
    m = found(model, state, req(DOC))
    assert m.total_tokens == 256.0 and m.host_tokens > 0  # all stored, some guessed demoted
    feed(model, [removed(0, 12, 4)], "array")  # "GPU" in 0.5.10: gone from both tiers
    assert found(model, state, req(DOC)).total_tokens == 192.0


def test_0_5_10_a_deeper_store_after_a_guessed_demotion_still_matches_the_whole_union() -> None:
    model, state = model_with(gpu_blocks=2)
    long = ids(384 + 1)
    feed(model, [*stored(long[:256], 0)], "array")  # the guess demotes blocks 2 and 3 to host
    feed(model, [*stored(long[256:384], 100, parent=15)], "array")  # deeper blocks: the guess keeps them
    m = found(model, state, req(long))  # on GPU and demotes their ancestors: GPU is not prefix-closed
    assert m.total_tokens == 384.0


def test_0_5_10_salted_requests_stay_learned() -> None:
    model, state = model_with(gpu_blocks=100)
    feed(model, [*stored(ids(64, 5000), 900)], "array")
    salted = req(DOC, tenant="t1")
    rec = model.record(salted, "a")
    assert rec is not None
    model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    pass_grace(model, "array")
    assert found(model, state, salted).total_tokens == 256.0


def test_0_5_23_salted_requests_are_exact_but_gateway_tenants_stay_learned() -> None:
    model, state = model_with(gpu_blocks=100)
    feed(model, [*stored(ids(64, 5000), 900)])
    salted, tenant = req(DOC, tenant="s1"), req(DOC, tenant="s1\x00tenant=acme")
    for r in (salted, tenant):
        rec = model.record(r, "a")
        assert rec is not None
        model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    feed(model, [*stored(DOC[:128], 0, salt="s1")])  # the engine kept half of the salted prompt
    pass_grace(model)
    assert found(model, state, salted).total_tokens == 128.0
    assert found(model, state, tenant).total_tokens == 256.0


def test_capacity_never_evicts_event_backed_blocks_on_gpu() -> None:
    model, state = model_with(policy=None, gpu_blocks=2, host_blocks=0)
    feed(model, [*stored(DOC[:256], 0)])
    assert found(model, state, req(DOC)).gpu_tokens == 256.0


def full_pools(model: CacheModel) -> None:
    """The engine's steady state: GPU (8 blocks) and host (8 blocks) full of other pages."""
    feed(model, [*stored(ids(512, 10_000), 1000)])
    feed(model, [*stored(ids(512, 20_000), 2000, medium="CPU_PINNED")])


def test_in_flight_blocks_stay_while_the_pools_are_full_of_event_backed_ones() -> None:
    """A document's first view routed to a replica whose pools the events show full: the question right
    behind it still finds the document there, queued (the engine will make room by evicting)."""
    model, state = model_with(gpu_blocks=8, host_blocks=8)
    full_pools(model)
    first = req(DOC)
    rec = model.record(first, "a")
    assert rec is not None
    assert found(model, state, req(DOC)).total_tokens == 256.0
    model.record(req(ids(257, 30_000)), "a")  # another document behind it: neither pushes the other out
    assert found(model, state, req(DOC)).total_tokens == 256.0
    assert found(model, state, req(ids(257, 30_000))).total_tokens == 256.0
    model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    assert found(model, state, req(DOC)).total_tokens == 256.0  # ran: awaiting its BlockStored
    pass_grace(model)
    assert found(model, state, req(DOC)) == NO_MATCH  # no event came: gone, as without the full pools


def test_a_learned_request_on_full_exact_pools_leaves_once_it_ran() -> None:
    """Keys the events cannot speak for are kept while their request is in flight, then evicted by
    capacity like any learned block (the capped scan of ``EXACT_GPU_SCAN`` still reaches them)."""
    model, state = model_with(gpu_blocks=8, host_blocks=8)
    full_pools(model)
    text = req(DOC, exact=False)
    rec = model.record(text, "a")
    assert rec is not None
    assert found(model, state, text).total_tokens == 256.0
    model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    feed(model, [], ts=2.0)
    assert found(model, state, text) == NO_MATCH
    assert found(model, state, req(ids(513, 10_000))).gpu_tokens == 512.0  # the event-backed ones stay


def test_in_flight_blocks_of_a_reset_replica_are_forgotten() -> None:
    model, state = model_with(gpu_blocks=8, host_blocks=8)
    full_pools(model)
    model.record(req(DOC), "a")
    model.kv_reset("a", "gap")
    assert found(model, state, req(DOC)) == NO_MATCH
    full_pools(model)
    other = req(ids(257, 30_000))
    model.record(other, "a")  # a request routed after the reset: its held keys are kept too
    assert found(model, state, other).total_tokens == 256.0


def test_reported_cached_tokens_are_accounted_but_do_not_rescale() -> None:
    model, _ = model_with()
    feed(model, [*stored(DOC[:256], 0)])
    rec = model.record(req(DOC), "a")
    assert rec is not None
    model.settle(rec, Report(ok=True, prompt_tokens=257, cached_tokens=0))
    acc = model.accuracy()["a"]
    assert acc.requests == 1 and acc.abs_error_tokens == 256.0
    assert (acc.gpu_factor, acc.host_factor) == (1.0, 1.0)


def test_reset_and_clear_forget_gpu_and_host() -> None:
    model, state = model_with()
    feed(model, [*stored(DOC[:256], 0)])
    model.kv_reset("a", "gap")
    assert found(model, state, req(DOC)) == NO_MATCH
    mode = model.kv_mode("a")
    assert (mode.resets, mode.last_reset, mode.pages) == (1, "gap", 0)
    feed(model, [*stored(ids(16, 256), 100, parent=15)])  # a child of a page from before the reset
    assert model.kv_mode("a").orphans == 1
    feed(model, [*stored(DOC[:256], 0)])
    assert found(model, state, req(DOC)).total_tokens == 256.0
    feed(model, [AllBlocksCleared()])
    assert found(model, state, req(DOC)) == NO_MATCH


def test_a_page_size_not_dividing_token_block_stays_learned() -> None:
    model, _ = model_with()
    feed(model, [*stored(DOC[:192], 0, page=48)])
    mode = model.kv_mode("a")
    assert (mode.mode, mode.why) == ("learned", "engine page size 48 does not divide token_block 64")
    assert model.kv_mode("b").why == "no KV events"
    assert not model.apply_kv_events("b", EventBatch(0, b"", 0.0, (), None, "empty"), "m")
