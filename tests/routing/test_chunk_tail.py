"""Tables for ``routing.chunk_tail``: where the last queued prefill step of a replica stops inserting, and
what a request routed behind it can reuse (the cache model's side in ``test_cache_model``)."""

from __future__ import annotations

from dataclasses import replace
from math import inf

import pytest

from routing.cache_model import CacheModel
from routing.chunk_tail import Cut, Tail, next_tail
from routing.config import RoutingConfig
from routing.types import ReplicaState, Report, RoutingRequest

BT = 16.0
C = 2048


def req(doc: int, tokens: int, question: int = 0) -> RoutingRequest:
    """A prompt of ``tokens`` engine tokens: a document's blocks, then a question's last block."""
    n = tokens // int(BT)
    hashes = (*range(doc * 10_000, doc * 10_000 + n - 1), question + 1_000_000)
    return RoutingRequest(model="m", block_hashes=hashes, prompt_tokens=tokens, block_tokens=BT)


def state(queued_s: float = 10.0, chunk: int = C, page: int = 16) -> ReplicaState:
    return ReplicaState(
        id="a", gpu_tokens=1 << 20, inflight_prefill_s=queued_s, chunk_tokens=chunk, page_size=page
    )


@pytest.mark.parametrize(
    ("tokens", "cached", "chunk", "cut", "room", "last_s"),
    [
        # 8192 tokens, 32 cached: chunks of 2048 from 32; the last one (2016 tokens) starts at 6176
        (8192, 32.0, C, 6176.0, 32.0, 8.0 * 2016 / 8160),
        # one step: the request's own new tokens are missing for whoever joins it
        (1024, 0.0, C, 0.0, 1024.0, 8.0),
        # chunking off: one step whatever the size
        (8192, 32.0, -1, 32.0, inf, 8.0),
    ],
)
def test_a_request_routed_to_an_idle_replica_leaves_its_last_step_open(
    tokens: int, cached: float, chunk: int, cut: float, room: float, last_s: float
) -> None:
    tail = next_tail(None, req(1, tokens), state(chunk=chunk), cached, cached, 8.0)
    assert tail is not None
    assert [c.tokens for c in tail.cuts] == [cut]
    assert (tail.room, tail.last_s) == (room, pytest.approx(last_s))


@pytest.mark.parametrize(
    ("tokens", "cached", "chunk"),
    [
        (2048 * 3 + 32, 32.0, C),  # the last chunk is a whole 2048: no room is left in its step
        (2048 * 3 + 32 - 8, 32.0, C),  # 8 tokens left, less than a page
        (8192, 32.0, 0),  # the replica does not report its chunk size
    ],
)
def test_no_tail_when_nobody_can_join_the_last_step(tokens: int, cached: float, chunk: int) -> None:
    assert next_tail(None, req(1, tokens), state(chunk=chunk), cached, cached, 8.0) is None


def test_a_repeat_behind_its_first_copy_finds_it_up_to_its_last_chunk() -> None:
    tail = next_tail(None, req(1, 8192), state(), 32.0, 32.0, 8.0)
    assert tail is not None
    repeat, other_question, other_doc = req(1, 8192, question=7), req(1, 8200, question=8), req(2, 8192)
    assert tail.limit(repeat, state(), lambda b: True) == 6176.0
    assert tail.limit(other_question, state(), lambda b: True) == 6176.0
    assert tail.limit(other_doc, state(), lambda b: True) == inf
    assert tail.limit(repeat, state(), lambda b: False) == inf  # confirmed: its last chunk is in
    assert tail.limit(repeat, state(queued_s=tail.last_s), lambda b: True) == inf  # last chunk started


def test_requests_sharing_the_last_step_each_miss_the_others_new_tokens() -> None:
    """Short chats behind a cold one: the first fits the step, the next joins it (sharing the system
    prompt the first is computing) and finds nothing of it; the step's seconds add up."""
    first = next_tail(None, req(1, 320), state(), 0.0, 0.0, 0.2)
    assert first is not None and first.room == C - 320
    second = req(1, 336, question=2)
    assert first.limit(second, state(), lambda b: True) == 0.0
    joined = next_tail(first, second, state(), 0.0, 304.0, 0.2)
    assert joined is not None
    assert [c.tokens for c in joined.cuts] == [0.0, 0.0]
    assert (joined.room, joined.last_s) == (C - 320 - 336, pytest.approx(0.4))


def test_a_request_chunked_past_the_last_step_ends_later_when_all_it_matched_is_in() -> None:
    """A repeat with a longer question joins the first copy's last step with 32 tokens of room, so it is
    chunked; its own last chunk comes a step later, when the first copy has inserted all the document it
    shares: whoever joins that step finds the shared part whole."""
    tail = next_tail(None, req(1, 8192), state(), 32.0, 32.0, 8.0)
    assert tail is not None and tail.room == 32.0
    repeat = req(1, 8240, question=3)  # 514 document blocks: 511 shared with the first copy
    after = next_tail(tail, repeat, state(), 6176.0, 511 * BT, 1.0)
    assert after is not None
    assert [c.tokens for c in after.cuts] == [8176.0]  # max(6176 + 32, what it matched: 8176)
    assert (after.room, after.last_s) == (16.0, pytest.approx(2032 / 2064))
    assert after.limit(req(1, 8240, question=4), state(), lambda b: True) == 8176.0
    assert after.limit(req(1, 8192, question=4), state(), lambda b: True) == inf  # block 511 differs


def test_the_cache_model_caps_a_repeat_routed_behind_its_first_copy_until_that_copy_is_in() -> None:
    cfg = RoutingConfig(block_chars=64, chars_per_token=4.0)
    model = CacheModel(cfg, BT)
    st = state()
    model.sync([st])
    first = model.record(req(1, 8100), "a", 8.0)  # nothing cached: its last chunk starts at 6144
    assert first is not None and first.match.total_tokens == 0.0
    repeat = req(1, 8100, question=5)  # 505 document blocks shared
    assert model.match(repeat, [st])["a"].total_tokens == 6144.0
    idle = replace(st, inflight_prefill_s=0.0)  # the first copy's prefill is over
    model.sync([idle])
    assert model.match(repeat, [idle])["a"].total_tokens == 8080.0
    model.sync([st])
    model.settle(first, Report(ok=True, cached_tokens=0, prompt_tokens=8100))  # its blocks are real
    assert model.match(repeat, [st])["a"].total_tokens == 8080.0


def test_a_tail_cut_is_a_block_boundary() -> None:
    tail = Tail((Cut(3, 42, 48.0),), 100.0, 1.0)
    hashes = (0, 1, 2, 42, 9)
    request = RoutingRequest(model="m", block_hashes=hashes, prompt_tokens=80, block_tokens=BT)
    assert tail.limit(request, state(), lambda b: b == 42) == 48.0
