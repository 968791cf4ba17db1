"""The pure parts of fault handling: the circuit breaker's state machine, the retry budget and its
backoff, and the deadlines scaled from the predicted TTFT (explicit clocks, no I/O)."""

from __future__ import annotations

import random

import pytest

from proxy.upstream.breaker import Breaker, BreakerPolicy, BreakerState
from proxy.upstream.deadlines import Deadlines
from proxy.upstream.retry_budget import WINDOW_S, RetryBudget, backoff_s

POLICY = BreakerPolicy(failures=3, cooldown_s=1.0, cooldown_max_s=3.0)


def tripped(now: float = 0.0) -> Breaker:
    b = Breaker(POLICY)
    assert [b.failure(now) for _ in range(3)] == [False, False, True]
    return b


def test_consecutive_failures_open_it_and_a_success_between_them_does_not() -> None:
    b = Breaker(POLICY)
    b.failure(0.0), b.failure(0.0), b.success(), b.failure(0.0), b.failure(0.0)
    assert b.state(0.0) is BreakerState.CLOSED and b.admits(0.0)
    assert b.failure(0.0) and b.state(0.5) is BreakerState.OPEN and not b.admits(0.5)
    assert not b.acquire(0.5) and b.trips_total == 1


def test_half_open_lets_exactly_one_trial_through_and_its_success_closes_it() -> None:
    b = tripped()
    assert b.state(1.0) is BreakerState.HALF_OPEN
    assert b.acquire(1.0) and not b.acquire(1.0) and not b.admits(1.0)
    b.success()
    assert b.state(1.0) is BreakerState.CLOSED and b.streak == 0


def test_a_failed_trial_reopens_it_for_twice_as_long_up_to_the_cap() -> None:
    b = tripped()
    assert b.acquire(1.0) and b.failure(1.0)  # open until 1 + 2
    assert b.state(2.9) is BreakerState.OPEN and b.state(3.0) is BreakerState.HALF_OPEN
    assert b.acquire(3.0) and b.failure(3.0)  # 4 s, capped at 3 s
    assert b.state(5.9) is BreakerState.OPEN and b.state(6.0) is BreakerState.HALF_OPEN
    assert b.trips_total == 3


def test_a_trial_without_verdict_frees_the_slot() -> None:
    b = tripped()
    assert b.acquire(1.0)
    b.release()
    assert b.acquire(1.0)


def test_a_good_health_check_closes_a_half_open_breaker_but_keeps_the_growth() -> None:
    b = tripped()
    b.probe_ok(0.5)
    assert b.state(0.5) is BreakerState.OPEN  # still cooling down: a probe does not cut it short
    b.probe_ok(1.0)
    assert b.state(1.0) is BreakerState.CLOSED
    for _ in range(3):
        b.failure(1.0)
    assert b.state(2.9) is BreakerState.OPEN and b.state(3.0) is BreakerState.HALF_OPEN  # 2 s this time


def test_reset_closes_it_as_new_and_late_failures_of_an_open_one_are_ignored() -> None:
    b = tripped()
    assert not b.failure(0.5) and b.trips_total == 1
    b.reset()
    assert b.state(0.5) is BreakerState.CLOSED and b.status(0.5)["state"] == "closed"


def test_retry_budget_allows_the_floor_plus_a_fraction_of_the_requests() -> None:
    budget = RetryBudget(ratio=0.2, floor_per_s=1.0)
    for _ in range(100):
        budget.request(0.5)
    allowed = 0.2 * 100 + 1.0 * WINDOW_S
    grants = [budget.spend(0.5) for _ in range(40)]
    assert grants.count(True) == allowed and not any(grants[int(allowed) :])
    assert budget.spend(WINDOW_S + 1.0)  # the window moved on: the old requests and retries left it


def test_a_zero_budget_refuses_every_retry() -> None:
    budget = RetryBudget(ratio=0.0, floor_per_s=0.0)
    budget.request(0.0)
    assert not budget.spend(0.0)


def test_backoff_is_full_jitter_under_the_capped_exponential() -> None:
    rng = random.Random(1)
    for retry, cap in ((0, 0.025), (1, 0.05), (2, 0.1), (6, 0.25)):
        values = [backoff_s(retry, 0.025, 0.25, rng) for _ in range(200)]
        assert min(values) >= 0.0 and max(values) <= cap and max(values) > cap / 2


@pytest.mark.parametrize(
    ("predicted", "streamed", "max_tokens", "expected"),
    [
        (0.1, True, None, 5.0),  # a cache hit: the floor
        (30.0, True, None, 122.0),  # a long cold prefill: 4 x 30 + 2
        (300.0, True, None, 600.0),  # capped by request_timeout
        (0.1, False, 100, 25.0),  # non-streamed: + 100 tokens x 0.2 s
        (0.1, False, None, 600.0),  # no max_tokens: request_timeout
    ],
)
def test_first_byte_deadline_scales_with_the_predicted_ttft(
    predicted: float, streamed: bool, max_tokens: int | None, expected: float
) -> None:
    assert Deadlines().first_byte_s(predicted, streamed, max_tokens) == pytest.approx(expected)


def test_a_failure_that_may_not_trip_is_counted_but_leaves_it_closed() -> None:
    b = Breaker(POLICY)
    assert not any(b.failure(0.0, may_trip=False) for _ in range(5))
    assert b.state(0.0) is BreakerState.CLOSED and b.failures == 5
    assert b.failure(0.0)  # allowed again: the count was kept
