"""The comparison's arithmetic on hand-built figures: ratios, within 10%, ranking, the set's lines."""

from __future__ import annotations

import math

import pytest

from bench.confirm.comparison import Figures, kvroute_ratio, ranking, scenario_row, set_summary, within
from bench.confirm.report import markdown, system_table
from bench.confirm.routers import metric_sum


def test_kvroute_ratio_is_against_the_best_other_by_mean() -> None:
    assert kvroute_ratio({"cost": 1.0, "cache_aware": 2.0, "round_robin": 1.25}) == (0.8, "round_robin")
    assert math.isnan(kvroute_ratio({"cost": 1.0})[0])
    assert math.isnan(kvroute_ratio({"cache_aware": 1.0, "round_robin": 2.0})[0])


def test_within_is_relative_to_the_simulated_ratio() -> None:
    assert within(1.0, 0.95) and within(0.99, 0.9)
    assert not within(1.0, 0.9) and not within(0.8, 1.0)
    assert not within(math.nan, 1.0) and not within(1.0, 0.0)


def test_ranking_is_by_mean_ttft_best_first() -> None:
    assert ranking({"cost": 0.5, "cache_aware": 0.7, "round_robin": 0.4}) == [
        "round_robin",
        "cost",
        "cache_aware",
    ]


def _row(seed: int, real: dict[str, float], sim: dict[str, float]) -> dict[str, object]:
    head = {"seed": seed, "description": f"seed {seed}", "scale": 1.0, "wall_s": 1.0, "notes": []}
    return scenario_row(head, {s: Figures(m, 2 * m) for s, m in real.items()},
                        {s: Figures(m, 2 * m) for s, m in sim.items()})  # fmt: skip


def test_a_scenario_row_and_the_set_lines() -> None:
    a = _row(1, {"cost": 0.8, "cache_aware": 1.0}, {"cost": 0.82, "cache_aware": 1.0})
    b = _row(2, {"cost": 1.2, "cache_aware": 1.0}, {"cost": 0.9, "cache_aware": 1.0})
    assert a["ratio_real"] == pytest.approx(0.8) and a["within"] and a["ranked_alike"]
    assert b["ratio_real"] == pytest.approx(1.2) and not b["within"] and not b["ranked_alike"]
    s = set_summary("t", "cmd", ["cost", "cache_aware"], [a, b])
    assert s["geomean_ratio_real"] == pytest.approx(math.sqrt(0.8 * 1.2))
    assert (s["worst_ratio_real"], s["worst_seed"]) == (pytest.approx(1.2), 2)
    assert (s["within_count"], s["ranked_alike_count"]) == (1, 1)
    assert list(s["targets"].values()) == [False, False, False]
    text = markdown(s)
    assert "| t | 2 | 0.980 |" in text and "NOT met" in text


def test_the_sim_side_only_counts_the_systems_run_for_real() -> None:
    row = _row(1, {"cost": 1.0, "cache_aware": 2.0}, {"cost": 1.0, "cache_aware": 2.0, "round_robin": 0.5})
    assert row["ratio_sim"] == pytest.approx(0.5) and row["best_other_sim"] == "cache_aware"


def test_metric_sum_adds_every_sample_of_the_counter() -> None:
    text = (
        "# HELP kvroute_replica_idle_while_queued_seconds_total x\n"
        'kvroute_replica_idle_while_queued_seconds_total{replica="a"} 1.5\n'
        'kvroute_replica_idle_while_queued_seconds_total{replica="b"} 2.0\n'
        "kvroute_replica_idle_while_queued_seconds_created 17.0\n"
    )
    assert metric_sum(text, "kvroute_replica_idle_while_queued_seconds_total") == 3.5
    assert metric_sum("", "kvroute_replica_idle_while_queued_seconds_total") is None


def test_each_systems_real_over_simulated_mean_is_summed_up_per_system() -> None:
    def row(real: dict[str, float], sim: dict[str, float]) -> dict[str, object]:
        return {
            "real": {k: {"mean_s": v} for k, v in real.items()},
            "sim": {k: {"mean_s": v} for k, v in sim.items()},
        }

    rows = [row({"cost": 2.0, "round_robin": 1.0}, {"cost": 1.0, "round_robin": 1.05}),
            row({"cost": 0.5, "round_robin": 3.0}, {"cost": 1.0, "round_robin": 3.0})]  # fmt: skip
    assert system_table(rows, ["cost", "round_robin"])[2:] == [
        "| cost | 1.00 | 0.50-2.00 | 0/2 |",
        "| round_robin | 0.98 | 0.95-1.00 | 2/2 |",
    ]
