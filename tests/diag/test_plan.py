"""Pure parts of the probe: pressure sizing (diag/pressure.py) and the verdict (diag/verdict.py)."""

from __future__ import annotations

import pytest

from diag.client import DiagError, Generation
from diag.pressure import check_context, plan_pressure
from diag.target import Pool
from diag.verdict import BROKEN, INCONCLUSIVE, OFF, WORKS, judge

# seed 1's replica: KV pool 354,788 tokens, host pool 709,577 tokens
SEED_POOL = Pool("http://a", 354_788, 709_577, "write_back", hybrid=True, page_size=1)
R = 40_000


def gen(
    ttft: float, cached: int | None, device: int | None, host: int | None, replica: str | None = None
) -> Generation:
    return Generation(ttft, ttft + 0.1, R, cached, device, host, None, replica)


COLD = gen(15.4, 0, 0, 0)
AGAIN = gen(0.1, R - 1, R - 1, 0)


def test_seed_pool_pressure_sits_mid_window_in_seed_sized_contexts() -> None:
    plan = plan_pressure(SEED_POOL, R, R)
    assert (plan.low, plan.high) == (354_788, 709_577 - R)
    assert plan.target_tokens == (354_788 + 669_577) // 2  # 512,182
    assert plan.contexts == 13  # seed 1 sent 10-14 contexts of 40K
    assert plan.context_tokens * plan.contexts >= plan.target_tokens
    assert plan.context_tokens <= R and plan.note == ""


def test_narrow_host_window_plans_just_past_the_gpu_and_says_so() -> None:
    pool = Pool("http://a", 48_000, 80_000, "write_through", hybrid=False)  # host - R = 40,000 < gpu
    plan = plan_pressure(pool, R, R)
    assert plan.target_tokens == 50_400  # 1.05 x gpu
    assert "too small" in plan.note


def test_hicache_off_plans_ten_percent_past_the_gpu() -> None:
    pool = Pool("http://a", 100_000, 0, None, hybrid=False)
    plan = plan_pressure(pool, R, R)
    assert plan.high is None and plan.target_tokens == 110_000 and plan.contexts == 3


def test_gateway_contexts_cannot_overshoot_the_host_bound() -> None:
    pool = Pool("http://a", 48_000, 96_016, "write_back", hybrid=False, page_size=16)
    single = plan_pressure(pool, R, R)
    fleet = plan_pressure(pool, R, R, replicas=3, gateway=True)
    assert fleet.target_tokens == single.target_tokens == 52_008
    assert fleet.context_tokens <= fleet.high - fleet.target_tokens  # type: ignore[operator]
    assert fleet.max_contexts == fleet.contexts * 6


@pytest.mark.parametrize(
    ("pool", "tokens", "message"),
    [
        (Pool("http://a", 48_000, 0, None, False, max_input_tokens=30_000), R, "max_req_input_len"),
        (Pool("http://a", 30_000, 0, None, False), R, "does not fit"),
        (Pool("http://a", 0, 0, None, False), R, "no GPU KV pool"),
    ],
)
def test_a_context_that_cannot_be_probed_is_a_clear_error(pool: Pool, tokens: int, message: str) -> None:
    with pytest.raises(DiagError, match=message):
        check_context(pool, tokens)


def test_verdicts() -> None:
    plan = plan_pressure(SEED_POOL, R, R)
    got = plan.target_tokens
    assert judge(SEED_POOL, plan, got, COLD, gen(0.4, R - 1, 0, R - 1), AGAIN).outcome == WORKS
    wt = Pool("http://a", 354_788, 709_577, "write_through", hybrid=True)
    broken = judge(wt, plan, got, COLD, gen(15.5, 0, 0, 0), AGAIN)
    assert broken.outcome == BROKEN and "write_through on a hybrid model" in broken.reason
    plain = Pool("http://a", 354_788, 709_577, "write_through", hybrid=False)
    assert "hybrid" not in judge(plain, plan, got, COLD, gen(15.5, 0, 0, 0), AGAIN).reason
    off = Pool("http://a", 354_788, 0, None, hybrid=False)
    assert judge(off, plan_pressure(off, R, R), got, COLD, gen(15.4, 0, 0, 0), AGAIN).outcome == OFF


def test_inconclusive_when_the_experiment_did_not_test_the_host_pool() -> None:
    plan = plan_pressure(SEED_POOL, R, R)
    on_gpu = judge(SEED_POOL, plan, plan.target_tokens, COLD, gen(0.1, R - 1, R - 1, 0), AGAIN)
    assert on_gpu.outcome == INCONCLUSIVE and "still on the GPU" in on_gpu.reason
    little = judge(SEED_POOL, plan, plan.low - 1, COLD, gen(15.4, 0, 0, 0), AGAIN)
    assert little.outcome == INCONCLUSIVE and "less than its GPU pool" in little.reason
    flooded = judge(SEED_POOL, plan, plan.high + 1, COLD, gen(15.4, 0, 0, 0), AGAIN)  # type: ignore[operator]
    assert flooded.outcome == INCONCLUSIVE and "left the host pool" in flooded.reason
    cold_b = gen(15.4, 0, 0, 0, "http://a")
    moved = judge(SEED_POOL, plan, plan.target_tokens, cold_b, gen(15.4, 0, 0, 0, "http://b"), AGAIN)
    assert moved.outcome == INCONCLUSIVE and "http://b" in moved.reason


def test_without_a_cached_token_report_time_decides() -> None:
    plan = plan_pressure(SEED_POOL, R, R)
    fast = Generation(0.4, 0.5, R, None, None, None, None, None)
    slow = Generation(15.5, 15.6, R, None, None, None, None, None)
    again = Generation(0.1, 0.2, R, None, None, None, None, None)
    assert judge(SEED_POOL, plan, plan.target_tokens, COLD, fast, again).outcome == WORKS
    assert judge(SEED_POOL, plan, plan.target_tokens, COLD, slow, again).outcome == BROKEN
    assert judge(SEED_POOL, plan, plan.target_tokens, COLD, fast, slow).notes  # R again was slow too
