"""Report math on synthetic records: hit ratio, percentiles, load max/mean, tables, README blocks."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from bench import plots, report
from bench.progress import Progress
from bench.runner import Record, replica_id


def rec(i: int, ttft: float | None, prompt: int, cached: int, replica: str = "a", tag: str = "t",
        error: str = "", sent: float = 0.0, e2e: float = 1.0) -> Record:  # fmt: skip
    return Record(i, tag, f"s{i}", 200, error, sent, 0.0, ttft, e2e, prompt, cached, 4, prompt, replica)


def test_percentile_interpolates_between_order_statistics() -> None:
    assert report.percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert report.percentile([1, 2, 3, 4], 0) == 1
    assert report.percentile([1, 2, 3, 4], 100) == 4
    assert report.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert math.isnan(report.percentile([], 50))


def test_hit_ratio_is_token_weighted_and_ignores_failures() -> None:
    records = [rec(0, 1.0, 1000, 900), rec(1, 1.0, 100, 0), rec(2, None, 5000, 5000, error="boom")]
    assert report.hit_ratio(records) == pytest.approx(900 / 1100)
    assert report.hit_ratio([]) == 0.0


def test_load_balance_max_over_mean_counts_idle_replicas() -> None:
    assert report.load_balance({"a": 6, "b": 2, "c": 0, "d": 0}) == pytest.approx((6, 3.0))
    assert report.load_balance({"a": 5, "b": 5}) == pytest.approx((5, 1.0))


def test_summarize_uses_successes_counters_and_probe_tags() -> None:
    records = [
        rec(0, 2.0, 100, 0, "a", "cold", sent=0.0, e2e=2.5),
        rec(1, 4.0, 100, 50, "b", "cold", sent=1.0, e2e=4.5),
        rec(2, 0.5, 100, 90, "a", "resend1", sent=5.0, e2e=1.0),
        rec(3, 1.5, 100, 90, "a", "resend2", sent=6.0, e2e=2.0),
        rec(4, None, 100, 0, "a", "resend2", error="HTTP 503", sent=7.0),
    ]
    s = report.summarize("x", records, {"a": 3, "b": 1, "c": 0, "d": 0})
    assert (s.requests, s.errors) == (5, 1)
    assert s.mean_ttft == pytest.approx(2.0)
    assert s.p50_ttft == pytest.approx(1.75)
    assert s.hit_ratio == pytest.approx(230 / 400)
    assert s.throughput == pytest.approx(4 / 8.0)
    assert (s.max_replica, s.max_over_mean) == pytest.approx((3, 3.0))
    assert s.by_tag["cold"] == pytest.approx(3.0)
    assert s.by_tag["resent"] == pytest.approx(1.0)
    fallback = report.summarize("y", records)
    assert fallback.per_replica == {"a": 3, "b": 1}


def test_table_results_and_readme_blocks(tmp_path: Path) -> None:
    s = report.summarize("sys-1", [rec(0, 1.0, 10, 5, tag="cold"), rec(1, 3.0, 10, 5, tag="resend1")])
    md = report.write_results(tmp_path, "probe", {"seed": 1}, [s], {"sys-1": []}, {"sys-2": "exited"})
    assert "| sys-1 | 2 | 0 | 2.00 |" in md and "resent s" in md and "skipped sys-2: exited" in md
    assert json.loads((tmp_path / "probe" / "summary.json").read_text())["summaries"][0]["system"] == "sys-1"
    readme = tmp_path / "README.md"
    readme.write_text("# benches\n\n## Overhead\nkeep me\n")
    report.update_readme(readme, "kvroute bench probe", {"seed": 1}, {"probe": "TABLE-1"})
    report.update_readme(readme, "kvroute bench rag", {"seed": 1}, {"rag": "TABLE-R"})
    report.update_readme(readme, "kvroute bench probe", {"seed": 2}, {"probe": "TABLE-2"})
    text = readme.read_text()
    assert "keep me" in text and "TABLE-2" in text and "TABLE-R" in text and "TABLE-1" not in text
    assert text.count(report.README_BEGIN) == 1 and text.count("### probe") == 1


def test_replica_ids_and_progress_line() -> None:
    assert replica_id("http://127.0.0.1:8000/") == replica_id("127.0.0.1:8000") == "127.0.0.1:8000"
    out = io.StringIO()
    p = Progress("agent kvroute-cost", 4, stream=out)
    p.advance()
    p.advance(error=True)
    assert "2/4" in p.line() and "err 1" in p.line()
    assert out.getvalue() == ""
    p.close("done")
    assert out.getvalue().endswith("done\n") and "[############............]" in out.getvalue()


def test_comparison_line_against_best_other_and_oracle() -> None:
    def summary(name: str, ttfts: list[float], cached: int) -> report.Summary:
        recs = [rec(i, t, 100, cached, tag="resend1") for i, t in enumerate(ttfts)]
        return report.summarize(name, recs)

    rows = [
        summary("kvroute-cost", [1.0, 1.0], 90),
        summary("a", [2.0, 4.0], 50),
        summary("b", [4.0, 3.0], 10),
        summary("oracle", [0.5, 0.5], 100),
    ]
    line = report.comparison(rows)
    assert "mean TTFT 0.33x the best other non-oracle (a 3.00 s)" in line
    assert "p99 0.25x (a 3.98 s)" in line
    assert "hit ratio 0.90x the oracle's" in line and "re-sent docs 2.00x the oracle's TTFT" in line
    assert report.comparison(rows[1:]) == ""


def test_plots_are_written_as_png(tmp_path: Path) -> None:
    records = {
        "a": [rec(0, 1.0, 10, 5, "r1"), rec(1, 2.0, 10, 0, "r2")],
        "oracle": [rec(0, 0.5, 10, 10, "r1")],
    }
    summaries = [report.summarize(name, recs) for name, recs in records.items()]
    plots.write_all(tmp_path, "w", summaries, records)
    for name in ("ttft_cdf.png", "hit_ratio.png", "load.png"):
        assert (tmp_path / "w" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_aggregate_is_the_mean_over_seeds_of_systems_present_in_every_run() -> None:
    def row(name: str, ttft: float, hit: float, tag: float, err: float = float("nan")) -> report.Summary:
        return report.Summary(name, 10, 1, ttft, ttft, 2 * ttft, hit, 3.0, 4, 1.2, {"r": 4}, {"t": tag},
                              model_error=err)  # fmt: skip

    runs = [
        [row("kvroute-cost", 1.0, 0.8, 2.0, 0.01), row("client-rr", 3.0, 0.5, 4.0), row("x", 9.0, 0.1, 1.0)],
        [row("client-rr", 5.0, 0.3, 6.0), row("kvroute-cost", 2.0, 0.6, 4.0, 0.03)],
    ]
    mean = report.aggregate(runs)
    assert [s.system for s in mean] == ["kvroute-cost", "client-rr"]  # "x" missed a seed
    cost = mean[0]
    assert (cost.requests, cost.errors, cost.max_replica) == (20, 2, 4)
    assert cost.mean_ttft == pytest.approx(1.5) and cost.p99_ttft == pytest.approx(3.0)
    assert cost.hit_ratio == pytest.approx(0.7) and cost.by_tag == {"t": pytest.approx(3.0)}
    assert cost.model_error == pytest.approx(0.02) and math.isnan(mean[1].model_error)
    assert report.comparison(mean).startswith(
        "kvroute-cost: mean TTFT 0.38x the best other non-oracle (client-rr 4.00 s); p99 0.38x"
    )
    assert report.aggregate([]) == []
