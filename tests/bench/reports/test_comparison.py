"""bench.reports.comparison: agreement by request index, the hit ratio of a span after a restart, verdicts."""

from __future__ import annotations

import math

from bench.overhead.requests import Result as OverheadResult
from bench.reports import comparison as cmp
from bench.runs.replay import Record


def rec(
    i: int, replica: str, ttft: float | None = 1.0, prompt: int = 100, cached: int = 0, session: str = "s"
) -> Record:
    error = "" if ttft is not None else "timeout"
    return Record(i, "t", session, 200, error, 0.0, 0.0, ttft, ttft, 1.0, prompt, cached, 4, prompt, replica)


def test_agreement_matches_requests_by_index_and_counts_only_those_that_succeeded_in_both() -> None:
    reference = [rec(0, "a"), rec(1, "b"), rec(2, "c"), rec(3, "a", ttft=None)]
    other = [rec(3, "a"), rec(2, "c"), rec(1, "a"), rec(0, "a"), rec(9, "a")]  # any order; 9 unmatched
    got = cmp.agreement(reference, other)
    assert (got.matched, got.same) == (3, 2) and got.share == 2 / 3
    assert math.isnan(cmp.agreement([], other).share)
    assert cmp.first_difference(reference, other) == 1
    assert cmp.first_difference(reference, reference) is None


def test_mean_ttft_and_hit_ratio_leave_failed_requests_out() -> None:
    records = [rec(0, "a", 1.0, 100, 50), rec(1, "a", 3.0, 300, 0), rec(2, "a", None, 1000, 1000)]
    assert cmp.mean_ttft(records) == 2.0
    assert cmp.hit_ratio(records) == 50 / 400
    assert math.isnan(cmp.hit_ratio([])) and math.isnan(cmp.mean_ttft([]))


def sends(*picks: tuple[int, int]) -> list[cmp.Send]:
    """(gateway, generation) per pick; the request index is the pick's position."""
    return [cmp.Send(i, g, gen) for i, (g, gen) in enumerate(picks)]


def test_restart_span_is_the_first_n_after_the_restart_and_the_others_sent_in_between() -> None:
    log = sends(
        (0, 0), (1, 0), (2, 0), (0, 0), (2, 0), (0, 0), (1, 1), (2, 0), (0, 0), (1, 1), (2, 0), (1, 1)
    )
    mine, others = cmp.restart_span(log, gateway=1, n=2)
    assert mine == [6, 9] and others == [7, 8]  # before the restart (1, 0) and after the 2nd (10, 11): out
    assert cmp.restart_span(log, gateway=1, n=50) == ([6, 9, 11], [7, 8, 10])  # fewer than n: all of them
    assert cmp.restart_span(log, gateway=2, n=5) == ([], [])  # never restarted


def test_hit_ratio_of_a_span_uses_the_picked_requests_only() -> None:
    records = [rec(i, "a", prompt=100, cached=100 if i % 2 else 0) for i in range(6)]
    assert cmp.hit_ratio(cmp.pick(records, [1, 3, 99])) == 1.0
    assert cmp.hit_ratio(cmp.pick(records, [0, 1])) == 0.5


def result(target: str, scenario: str, concurrency: int, rps: float) -> OverheadResult:
    return OverheadResult(target, scenario, concurrency, 100, 0, 1.0, 2.0, 0.5, 1.0, rps)


def test_throughput_ratios_pair_kvroute_with_and_without_state_per_scenario() -> None:
    results = [
        result("direct", "chat small", 16, 2000.0),
        result("kvroute", "chat small", 16, 1000.0),
        result("kvroute+state", "chat small", 16, 950.0),
        result("kvroute", "chat small", 1, 400.0),
    ]
    small16, small1 = cmp.throughput_ratios(results)
    assert (small16.scenario, small16.concurrency, small16.ratio) == ("chat small", 16, 0.95)
    assert small1.concurrency == 1 and math.isnan(small1.ratio)  # no synced run at concurrency 1


def test_within_is_two_sided_and_nan_is_a_miss() -> None:
    assert cmp.within(1.05, 0.05) and cmp.within(0.96, 0.05)
    assert not cmp.within(1.06, 0.05) and not cmp.within(0.94, 0.05) and not cmp.within(math.nan, 0.05)
    assert (cmp.verdict(True), cmp.verdict(False)) == ("PASS", "MISS")


def test_stickiness_counts_later_turns_served_where_the_previous_turn_of_their_session_was() -> None:
    records = [
        rec(3, "b", session="x"),
        rec(0, "a", session="x"),
        rec(1, "a", session="y"),
        rec(2, "a", session="x"),
        rec(4, "b", session="y"),
        rec(5, "c", None, session="x"),
    ]
    assert cmp.stickiness(records) == 1 / 3  # x: a -> a (same), a -> b (moved); y: a -> b (moved)
    assert math.isnan(cmp.stickiness([rec(0, "a", session="p"), rec(1, "a", session="q")]))


def test_one_view_counts_requests_every_gateway_previewed_and_all_named_alike() -> None:
    previews = {0: ("a", "a", "a"), 1: ("a", "b", "a"), 2: ("b", "", "b"), 3: ("c",), 4: ("c", "c", "c")}
    got = cmp.one_view(previews)  # 2 had a gateway that did not answer, 3 only one gateway asked
    assert (got.matched, got.same) == (3, 2)
    assert math.isnan(cmp.one_view({}).share)


def test_preview_held_compares_the_deciding_gateways_preview_with_the_serving_replica() -> None:
    previews = {0: ("a", "b"), 1: ("a", "b"), 2: ("a", "a")}
    sends = [cmp.Send(0, 1, 0), cmp.Send(1, 0, 0), cmp.Send(2, 1, 0)]
    records = [rec(0, "b"), rec(1, "b"), rec(2, "a", ttft=None)]  # 2 failed: left out
    got = cmp.preview_held(previews, sends, records)
    assert (got.matched, got.same) == (2, 1)  # 0: #1 said b, served on b; 1: #0 said a, served on b
