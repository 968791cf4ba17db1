"""What a copy of a shared prefix is worth (routing.placement, routing.demand): each rule on its own,
deterministic, no timing."""

from __future__ import annotations

import pytest

from routing.config import RoutingConfig
from routing.demand import MIN_SHARED_BLOCKS, DemandBook, prefix_key
from routing.placement import copy_worth_s
from routing.types import Candidate, PrefixMatch, ReplicaState, RoutingRequest
from tests.routing.harness import PolicyHarness

DOC = tuple(range(1, 101))  # a 100-block shared document, 16 tokens a block


def req(question: int) -> RoutingRequest:
    return RoutingRequest("m", (*DOC, 10_000 + question), 1616, 16.0)


def cand(
    rid: str, held: float = 0.0, queued_s: float = 0.0, rate: float = 1.0, util: float = 0.3
) -> Candidate:
    state = ReplicaState(id=rid, inflight_prefill_s=queued_s, arrival_rate=rate, utilization=util)
    return Candidate(state, PrefixMatch(held))


@pytest.mark.parametrize(
    ("lam", "x", "holders_wait", "wait", "k", "expected"),
    [
        (2.0, 0.4, 3.0, 0.0, 1, 2.0 * 3.4 * 3.0 / 2),  # λ_P (W_H + x) (W_H - W) / (k + 1)
        (0.0, 0.4, 3.0, 0.0, 1, 0.0),  # no demand: a copy is worth nothing
        (2.0, 0.4, 1.0, 1.5, 1, 0.0),  # the holders queue less than this replica: nothing spared
        (2.0, 0.4, 3.0, 1.0, 3, 2.0 * 3.4 * 2.0 / 4),  # more holders already: each copy spares less
    ],
)
def test_the_worth_formula(
    lam: float, x: float, holders_wait: float, wait: float, k: int, expected: float
) -> None:
    assert copy_worth_s(lam, x, holders_wait, wait, k) == pytest.approx(expected)


def test_the_shared_prefix_is_the_longest_any_replica_holds() -> None:
    key, tokens = prefix_key(req(1), [cand("a", held=1600.0), cand("b", held=320.0), cand("c")])
    assert (key, tokens) == (100, 1600.0)
    assert prefix_key(req(1), [cand("a", held=16.0 * (MIN_SHARED_BLOCKS - 1))]) == (None, 0.0)


def test_demand_is_a_decayed_share_of_recent_requests() -> None:
    book = DemandBook(half_life=10.0)
    for _ in range(30):
        book.note(7)
    assert book.share(7) == pytest.approx(1.0)
    for _ in range(10):  # ten other requests: the thirty weigh half of what they did
        book.note(None)
    d = 0.5 ** (1 / 10)
    assert book.share(7) == pytest.approx(d**10 * (1 - d**30) / (1 - d**40)) and book.share(8) == 0.0


def test_the_book_stays_bounded() -> None:
    book = DemandBook(max_keys=8)
    for k in range(100):
        book.note(k)
    assert len(book._counts) <= 8 and book.share(99) > 0.0


def test_a_hot_document_is_copied_to_an_idle_replica_before_its_holders_queue_long() -> None:
    """The holder queues 0.3 s behind the document's own questions; a copy elsewhere costs a 0.4 s
    prefill. With no demand recorded the question stays behind the holder's queue (its own TTFT is
    lower there); once the document is most of the traffic, the copy is worth more than it costs (the
    questions arriving while it is made each spared the holder's queue) and the idle replica gets it."""
    policy = PolicyHarness("cost", RoutingConfig())
    holder, idle = cand("h", held=1600.0, queued_s=0.3, rate=3.0, util=0.6), cand("i", rate=0.0, util=0.0)
    assert policy.route(req(0), [holder, idle]).replica == "h"
    for q in range(1, 40):  # the document's questions keep coming, all to its holder
        policy.route(req(q), [holder, cand("i", rate=3.0, queued_s=0.3, held=1600.0)])
    assert policy.route(req(99), [holder, idle]).replica == "i"
    off = PolicyHarness("cost", RoutingConfig(copy_worth=0.0))
    for q in range(40):
        off.route(req(q), [holder, cand("i", rate=3.0, queued_s=0.3, held=1600.0)])
    assert off.route(req(99), [holder, idle]).replica == "h"  # the rule off: only the copy's cost counts
