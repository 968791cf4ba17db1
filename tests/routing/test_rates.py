"""Online rate learning: converges to the true rates, stays in bounds, resists outliers."""

from __future__ import annotations

import pytest

from routing.config import RoutingConfig
from routing.rates import RateBook, robust_update
from routing.tokens import TokenEstimator
from routing.types import Prediction, PrefixMatch, Report, RoutingRequest, TtftTerms

CFG = RoutingConfig(prefill_tokens_per_s=4000.0, host_load_tokens_per_s=100_000.0, overhead_s=0.05)
Sample = tuple[RoutingRequest, Prediction, Report]


def outcome(
    prompt: int,
    cached: int,
    ttft: float | None,
    *,
    gpu: float = 0.0,
    host: float = 0.0,
    queue: float = 0.0,
    replica: str = "a",
    ok: bool = True,
) -> Sample:
    req = RoutingRequest(model="m", block_hashes=(), prompt_tokens=prompt, block_tokens=16.0)
    pred = Prediction(replica, PrefixMatch(gpu, host), TtftTerms(queue_s=queue))
    return req, pred, Report(ok=ok, prompt_tokens=prompt, cached_tokens=cached, ttft_s=ttft)


def observe(book: RateBook, sample: Sample) -> None:
    book.observe(*sample)


def test_prefill_rate_converges_to_the_observed_one() -> None:
    book = RateBook(CFG)
    for i in range(60):
        tokens = 2000 + 100 * (i % 7)
        observe(book, outcome(tokens, 0, 0.05 + 0.3 + tokens / 2000.0, queue=0.3))
    assert book.get("a").prefill_tokens_per_s == pytest.approx(2000.0, rel=0.05)


def test_host_rate_is_learned_from_reloads_beyond_the_gpu_run() -> None:
    book = RateBook(CFG)
    for _ in range(60):
        observe(book, outcome(40_000, 39_990, 0.05 + 39_000 / 50_000.0, gpu=990.0, host=39_000.0))
    rates = book.get("a")
    assert rates.host_tokens_per_s == pytest.approx(50_000.0, rel=0.05)
    assert rates.prefill_tokens_per_s == 4000.0


def test_a_reload_behind_a_longer_queue_teaches_nothing() -> None:
    """A host reload of 39K tokens takes 0.39 s at 100K tokens/s; behind a predicted 5 s queue that the
    replica actually served in 7 s, the 2 s queueing error would be learned as a reload 6x slower."""
    book = RateBook(CFG)
    for _ in range(30):
        observe(book, outcome(40_000, 39_990, 0.05 + 7.0 + 0.39, gpu=990.0, host=39_000.0, queue=5.0))
    assert book.get("a").host_tokens_per_s == pytest.approx(CFG.host_load_tokens_per_s)
    for _ in range(30):  # with nothing queued ahead the same reloads teach the rate
        observe(book, outcome(40_000, 39_990, 0.05 + 39_000 / 50_000.0, gpu=990.0, host=39_000.0))
    assert book.get("a").host_tokens_per_s == pytest.approx(50_000.0, rel=0.1)


def test_a_prefill_behind_a_queue_shorter_than_itself_still_teaches() -> None:
    book = RateBook(CFG)
    for _ in range(60):
        observe(book, outcome(8000, 0, 0.05 + 1.0 + 8000 / 2000.0, queue=1.0))
    assert book.get("a").prefill_tokens_per_s == pytest.approx(2000.0, rel=0.05)


def test_overhead_is_learned_from_small_requests() -> None:
    book = RateBook(CFG)
    for _ in range(60):
        observe(book, outcome(100, 50, 0.1 + 50 / 4000.0))
    assert book.get("a").overhead_s == pytest.approx(0.1, rel=0.05)


def test_estimates_stay_within_bounds_and_one_outlier_moves_them_little() -> None:
    book = RateBook(CFG)
    for _ in range(100):
        observe(book, outcome(4000, 0, 0.05 + 4000 / 1.0))  # absurdly slow replica: 1 token/s
    assert book.get("a").prefill_tokens_per_s == pytest.approx(0.02 * 4000.0)  # the lower bound
    assert book.get("b").prefill_tokens_per_s == pytest.approx(0.02 * 4000.0)  # unsampled: the fleet's
    assert robust_update(100.0, 1e9, 100.0) == pytest.approx(120.0)  # clipped to 2x, then alpha 0.2


def test_failed_or_untimed_outcomes_teach_nothing() -> None:
    book = RateBook(CFG)
    observe(book, outcome(4000, 0, 10.0, ok=False))
    observe(book, outcome(4000, 0, None))
    assert book.own("a") is None and book.get("a").prefill_tokens_per_s == 4000.0


def test_bytes_per_token_converges_and_ignores_tiny_prompts() -> None:
    est = TokenEstimator(4.0, block_chars=256)
    est.observe(1000, 3)
    assert est.bytes_per_token == 4.0
    for _ in range(50):
        est.observe(3000, 1000)
    assert est.bytes_per_token == pytest.approx(3.0, rel=0.02)
    assert est.block_tokens() == pytest.approx(256 / 3.0, rel=0.02)
    assert est.text(3000).prompt_tokens == pytest.approx(1000, rel=0.02)


def test_token_id_prompts_are_exact_and_their_blocks_are_token_blocks() -> None:
    est = TokenEstimator(4.0, block_chars=256)
    ids = est.ids(count=100, block_tokens=64)
    assert ids.exact and ids.prompt_tokens == 100 and ids.block_tokens == 64.0


def test_a_replica_is_shrunk_toward_the_fleet_until_it_has_its_own_samples() -> None:
    book = RateBook(CFG)
    observe(book, outcome(4000, 0, 0.05 + 4000 / 20_000.0))  # one fast sample on replica "a"
    a, b = book.get("a").prefill_tokens_per_s, book.get("b").prefill_tokens_per_s
    assert a == pytest.approx(b)  # one sample is no evidence that "a" is faster than "b"
    for _ in range(200):
        observe(book, outcome(4000, 0, 0.05 + 4000 / 8000.0))
    for _ in range(200):
        observe(book, outcome(4000, 0, 0.05 + 1.0, replica="c"))
    own_a = book.own("a")
    assert own_a is not None and own_a.prefill_tokens_per_s == pytest.approx(8000.0, rel=0.05)
    assert book.get("a").prefill_tokens_per_s > 1.5 * book.get("c").prefill_tokens_per_s
