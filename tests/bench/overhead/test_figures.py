"""bench/overhead/figures.py and report.py: per-run figures, their medians over runs, the issue's verdicts,
and the table and plot made of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.overhead.cases import KEPT_GOALS, SMALL_GOALS, goals
from bench.overhead.figures import median, rows, run_figures
from bench.overhead.plot import latency_groups, plot
from bench.overhead.report import markdown, table
from bench.overhead.requests import Result


def res(target: str, p50: float, p99: float, rps: float, cpu: float, conc: int = 1) -> Result:
    return Result(target, "small chat", conc, 100, 0, p50, p99, p50, p99, rps, cpu)


def one_run(kv_p50: float, kv_rps: float, direct_rps: float = 1000.0) -> list[Result]:
    return [
        res("direct", 0.5, 1.0, direct_rps, 0.3),
        res("kvroute", kv_p50, 2.0, kv_rps, 0.5),
        res("sglang-router", 0.7, 1.2, 800.0, 0.1),
        res("direct", 5.0, 8.0, 2 * direct_rps, 0.2, conc=16),
        res("kvroute", 9.0, 20.0, kv_rps, 0.4, conc=16),
        res("sglang-router", 6.0, 9.0, 1600.0, 0.1, conc=16),
    ]


RUNS = [one_run(1.5, 500.0), one_run(0.9, 700.0), one_run(1.1, 300.0, direct_rps=500.0)]


def test_added_and_kept_are_against_direct_in_the_same_run() -> None:
    fig = run_figures(RUNS[2])
    kv = fig[("small chat", 1, "kvroute")]
    assert kv["added_p50_ms"] == pytest.approx(0.6) and kv["added_p99_ms"] == pytest.approx(1.0)
    assert kv["kept"] == pytest.approx(300 / 500)
    assert kv["kept_vs_peer"] == pytest.approx((300 / 500) / (800 / 500))
    assert kv["cpu_ms"] == 0.5
    assert fig[("small chat", 16, "kvroute")]["kept"] == pytest.approx(300 / 1000)
    assert math.isnan(run_figures(RUNS[0][:2])[("small chat", 1, "kvroute")]["kept_vs_peer"])  # no router


def test_a_row_holds_every_run_and_their_median() -> None:
    table_rows = rows(RUNS, goals(16, 128))
    assert [(r.case, r.concurrency, r.target) for r in table_rows][:3] == [
        ("small chat", 1, "direct"),
        ("small chat", 1, "kvroute"),
        ("small chat", 1, "sglang-router"),
    ]
    kv = table_rows[1]
    assert kv.requests == 300 and kv.goals == SMALL_GOALS
    assert list(kv.per_run["added_p50_ms"]) == pytest.approx([1.0, 0.4, 0.6])
    assert kv.median("added_p50_ms") == pytest.approx(0.6)
    assert list(kv.per_run["kept"]) == pytest.approx([0.5, 0.7, 0.6])
    assert kv.median("kept") == pytest.approx(0.6)
    assert median([3.0, float("nan"), 1.0]) == 2.0 and math.isnan(median([float("nan")]))
    p50, p99 = kv.verdicts()
    assert p50.value == pytest.approx(0.6) and p50.met is False
    assert p99.value == 1.0 and p99.met is True
    wide = next(r for r in table_rows if (r.concurrency, r.target) == (16, "kvroute"))
    assert wide.goals == KEPT_GOALS
    (kept,) = wide.verdicts()
    assert kept.value == pytest.approx(median([0.25 / 0.8, 0.35 / 0.8, 0.3 / 1.6]))  # runs' kvroute / peer
    assert kept.met is False
    assert not [v for r in table_rows if r.target != "kvroute" for v in r.verdicts()]


def test_the_table_gives_medians_with_each_run_and_the_verdicts() -> None:
    text = table(rows(RUNS, goals(16, 128)))
    assert (
        "| small chat | 1 | kvroute | 300 | 0 | 1.10 (1.50, 0.90, 1.10) | +0.60 (+1.00, +0.40, +0.60) "
        "| +1.00 (+1.00, +1.00, +1.00) | 500 (500, 700, 300) | 0.60 (0.50, 0.70, 0.60) "
        "| 0.50 (0.50, 0.50, 0.50) | added p50 ≤ 0.5 ms; added p99 ≤ 1 ms "
        "| MISS (+0.60 ms); PASS (+1.00 ms) |"
    ) in text
    assert "| small chat | 1 | direct | 300 | 0 | 0.50 (0.50, 0.50, 0.50) |  |  |" in text
    assert "kept ≥ 0.8x sglang-router's kept | MISS (0.31x) |" in text


def test_without_sglang_router_the_relative_target_is_not_judged(tmp_path: Path) -> None:
    runs = [[r for r in run if r.target != "sglang-router"] for run in RUNS[:1]]
    table_rows = rows(runs, goals(16, 128))
    assert "| n/a |" not in table(table_rows) and "n/a (n/a)" in table(table_rows)
    loads = [{"load_average_1m_start": 1.0, "load_average_1m": 2.0}]
    meta = {"command": "x", "runs_done": 1, "cores": 2, "wall_s": 1.0, "kvroute": "kv", "label": "",
            "sglang_router": "0.3.2", "runs": loads}  # fmt: skip
    md = markdown(meta, table_rows)
    assert "- small chat, concurrency 16: kept ≥ 0.8x sglang-router's kept: n/a (n/a)" in md
    assert "1.0 -> 2.0" in md
    plot(tmp_path / "p.png", table_rows)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_shows_the_judged_latencies_and_the_unjudged_ones_p50() -> None:
    plain = [Result("direct", "long", 1, 1, 0, 1.0, 1.0, 1.0, 1.0, 1.0)]
    both = rows([RUNS[0] + plain], goals(16, 128))
    assert latency_groups(both) == [
        ("small chat", 1, "added_p50_ms"),
        ("small chat", 1, "added_p99_ms"),
        ("long", 1, "added_p50_ms"),
    ]
