"""The Router: one request's route → retarget → finish, the one token estimator, and the ledger."""

from __future__ import annotations

import dataclasses

import pytest

from routing.config import RoutingConfig
from routing.pipeline import NoCandidates
from routing.policies.consistent_hash import rendezvous_weight
from routing.prompt import ChatPrompt, Message, Namespace, PromptRequest, TextPrompt, TokenPrompt
from routing.router import MAX_OPEN, Router
from routing.types import Reason, ReplicaState, Report

CFG = RoutingConfig(block_chars=64, chars_per_token=4.0)


def replica(rid: str, **kw: object) -> ReplicaState:
    base = ReplicaState(id=rid, gpu_tokens=100_000, host_tokens=200_000, write_policy="write_back")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def text(n_bytes: int, seed: str = "d", **kw: object) -> PromptRequest:
    body = (seed * n_bytes)[:n_bytes]
    return PromptRequest("m", TextPrompt(body), **kw)  # type: ignore[arg-type]


def test_route_records_the_prompt_so_a_repeat_finds_it_on_that_replica() -> None:
    router = Router(CFG)
    states = [replica("a"), replica("b")]
    first = router.route(text(6400), states)
    assert first.request.prompt_tokens == 1600 and len(first.request.block_hashes) == 100
    assert first.prediction.replica == first.replica and first.prediction.cached_tokens == 0
    router.finish(first, Report(ok=True, prompt_tokens=1600, cached_tokens=0, ttft_s=0.4))
    again = router.route(text(6400), states)
    assert again.replica == first.replica and again.decision.reason is Reason.PREFIX_GPU
    assert again.prediction.cached_tokens == pytest.approx(1599)  # capped at prompt - 1
    assert again.prediction.uncached_tokens == pytest.approx(1)


def test_a_retried_request_is_learned_against_the_replica_that_served_it() -> None:
    """The first choice ``a`` has 1 s of prefill queued; the request is retried on idle ``b``, which
    serves it at 2000 tokens/s. The ticket's prediction follows it to ``b`` (no queue there), so ``b``
    learns 2000 tokens/s. Learning b's TTFT against a's predicted queue (the bug this replaced: the
    retry kept the first replica's breakdown) would learn ~4000."""
    router = Router(dataclasses.replace(CFG, policy="consistent_hash"))
    busy, idle = replica("a", inflight_requests=2, inflight_prefill_s=1.0), replica("b")
    key = next(
        k
        for k in map(str, range(100))
        if rendezvous_weight(b"s:" + k.encode(), "a") > rendezvous_weight(b"s:" + k.encode(), "b")
    )
    for i in range(60):
        req = text(16_000, seed=f"{i}x", session=key)  # rendezvous on the key prefers "a"
        ticket = router.route(req, [busy, idle])
        assert ticket.replica == "a" and ticket.prediction.terms.queue_s > 0.5
        router.finish(ticket, Report(ok=False))  # a failed before its first byte
        retried = router.retarget(ticket, "b")
        assert retried.replica == "b" and retried.decision.reason is Reason.FALLBACK
        assert retried.prediction.replica == "b" and retried.prediction.terms.queue_s == 0.0
        ttft = 0.05 + 4000 / 2000.0
        router.finish(retried, Report(ok=True, prompt_tokens=4000, cached_tokens=0, ttft_s=ttft))
    own = router.rates.own("b")
    assert own is not None and own.prefill_tokens_per_s == pytest.approx(2000.0, rel=0.05)
    assert router.rates.own("a") is None  # a never served anything


def test_retarget_rolls_back_the_first_record_and_a_second_finish_is_ignored() -> None:
    router = Router(dataclasses.replace(CFG, policy="round_robin"))
    states = [replica("a"), replica("b")]
    ticket = router.route(text(6400), states)
    other = "b" if ticket.replica == "a" else "a"
    moved = router.retarget(ticket, other)  # the first attempt is rolled back without a finish
    router.finish(moved, Report(ok=True, prompt_tokens=1600, cached_tokens=0, ttft_s=0.4))
    router.finish(moved, Report(ok=False))  # a second finish: no rollback of what ran
    router.finish(ticket, Report(ok=False))  # the retargeted one: ignored
    first, second = router.cache.tiers(ticket.replica), router.cache.tiers(other)
    assert first is not None and second is not None
    assert len(first.gpu) == 0 and len(second.gpu) == 100
    assert router.status().open_tickets == 0


def test_one_estimator_learns_bytes_per_token_and_resizes_the_cache_model() -> None:
    router = Router(CFG)
    states = [replica("a", gpu_tokens=16_000)]
    tiers_before = router.cache.block_tokens
    for i in range(10):
        t = router.route(text(8000, seed=f"{i}y"), states)
        router.finish(t, Report(ok=True, prompt_tokens=4000, cached_tokens=0, ttft_s=1.0))  # 2 B/token
    assert router.tokens.bytes_per_token == pytest.approx(2.0)
    assert router.cache.block_tokens == pytest.approx(32.0) and tiers_before == 16.0
    tiers = router.cache.tiers("a")
    assert tiers is not None and tiers.gpu.capacity == 16_000  # capacities stay in engine tokens
    assert router.route(text(8000), states).request.prompt_tokens == 4000


def test_token_id_prompts_are_exact_and_teach_the_estimator_nothing() -> None:
    router = Router(CFG)
    ids = PromptRequest("m", TokenPrompt(tuple(range(1000, 1500))))
    t = router.route(ids, [replica("a")])
    assert t.request.prompt_tokens == 500 and t.canonical_bytes == 0
    router.finish(t, Report(ok=True, prompt_tokens=500, cached_tokens=0, ttft_s=0.2))
    assert router.tokens.bytes_per_token == 4.0


def test_namespaces_never_share_blocks_and_chat_prompts_grow_by_whole_turns() -> None:
    router = Router(CFG)
    doc = Message("system", "policy " * 200)
    a = PromptRequest("m", ChatPrompt((doc,)), Namespace(cache_salt="tenant-a"))
    b = dataclasses.replace(a, namespace=Namespace(cache_salt="tenant-b"))
    grown = dataclasses.replace(a, prompt=ChatPrompt((doc, Message("user", "a question"))))
    ta, tb, tg = (router.route(r, [replica("r")]).request for r in (a, b, grown))
    assert not set(ta.block_hashes) & set(tb.block_hashes)
    assert tg.block_hashes[: len(ta.block_hashes)] == ta.block_hashes


def test_pass_through_requests_are_sized_not_hashed_and_teach_nothing() -> None:
    router = Router(CFG)
    t = router.route(PromptRequest("", None, size_bytes=4000), [replica("a")])
    assert t.request.block_hashes == () and t.request.prompt_tokens == 1000 and not t.prompted
    router.finish(t, Report(ok=True, prompt_tokens=10, ttft_s=30.0))
    assert router.rates.own("a") is None and router.tokens.bytes_per_token == 4.0


def test_no_healthy_replica_raises() -> None:
    with pytest.raises(NoCandidates):
        Router(CFG).route(text(100), [replica("a", healthy=False)])


def test_tickets_never_finished_are_settled_once_the_ledger_is_full() -> None:
    router = Router(CFG)
    states = [replica("a", gpu_tokens=10**9)]
    first = router.route(text(640, seed="first"), states)
    for i in range(MAX_OPEN):
        router.route(text(64, seed=f"{i}z"), states)
    assert router.status().open_tickets == MAX_OPEN
    router.finish(first, Report(ok=False))  # too late: it was settled as if it ran
    assert router.route(text(640, seed="first"), states).prediction.cached_tokens > 0


def test_forget_and_restart_reach_the_cache_model_the_rates_and_the_policy() -> None:
    router = Router(CFG)
    states = [replica("a"), replica("b")]
    t = router.route(text(6400, session="s"), states)
    router.finish(t, Report(ok=True, prompt_tokens=1600, cached_tokens=0, ttft_s=0.5))
    router.restart(t.replica)
    tiers = router.cache.tiers(t.replica)
    assert tiers is not None and len(tiers.gpu) == 0
    assert router.route(text(6400), states).prediction.cached_tokens == 0
    assert router.rates.own(t.replica) is not None  # same hardware: rates survive a restart
    router.forget(t.replica)
    assert router.cache.tiers(t.replica) is None and router.rates.own(t.replica) is None
    status = router.status()
    assert set(status.replicas) == {"a", "b"} - {t.replica} and status.policy == "cost"
