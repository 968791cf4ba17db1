"""Report math on synthetic records: hit ratio, percentiles, balance in prefill seconds, tables, seeds."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from bench.reports import plots
from bench.reports import tables as report
from bench.reports.fleet_work import replica_work
from bench.runs.progress import Progress
from bench.runs.replay import Record
from bench.systems.fleet import Counters
from bench.systems.procs import replica_id
from emulator.timing import PROFILES, ProfileTiming


def rec(i: int, ttft: float | None, prompt: int, cached: int, replica: str = "a", tag: str = "t",
        error: str = "", sent: float = 0.0, e2e: float = 1.0, due: float | None = None,
        capped: bool = False) -> Record:  # fmt: skip
    due = sent if due is None else due
    send_ttft = None if ttft is None else ttft - (sent - due)
    return Record(i, tag, f"s{i}", 200, error, due, sent, ttft, send_ttft, e2e, prompt, cached, 4, prompt,
                  replica, capped)  # fmt: skip


def summary(name: str, mean: float, p99: float, hit: float = 0.5) -> report.Summary:
    return report.Summary(name, 4, 0, mean, mean, p99, mean, hit, 1.0, 2, 3.0, 1.0)


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


def test_balance_max_over_mean_counts_idle_replicas() -> None:
    assert report.balance({"a": 6, "b": 2, "c": 0, "d": 0}) == pytest.approx((6, 3.0))
    assert report.balance({"a": 5.0, "b": 5.0}) == pytest.approx((5.0, 1.0))


def test_replica_work_is_the_uncached_prefill_plus_reloads_each_replica_reported() -> None:
    timing = ProfileTiming(PROFILES["rtx3090x2"], hicache=True)
    records = [rec(0, 1.0, 8000, 0, "a"), rec(1, 0.1, 8000, 7984, "a"), rec(2, 0.2, 4000, 0, "b"),
               rec(3, None, 9000, 0, "b", error="HTTP 500")]  # fmt: skip
    counters = {"a": Counters(2, 0, 0), "b": Counters(2, 40_000, 0), "c": Counters(0, 0, 0)}
    work = replica_work(records, counters, timing)
    assert work["a"] == pytest.approx(timing.prefill_seconds(0, 8000) + timing.prefill_seconds(7984, 8000))
    assert work["b"] == pytest.approx(
        timing.prefill_seconds(0, 4000) + 40_000 / PROFILES["rtx3090x2"].host_rate
    )
    assert work["c"] == 0.0 and set(work) == {"a", "b", "c"}
    s = report.summarize("x", records, {r: c.requests for r, c in counters.items()}, work)
    assert s.max_work == pytest.approx(work["a"]) and s.max_replica == 2
    assert s.work_max_over_mean == pytest.approx(work["a"] / (sum(work.values()) / 3))


def test_summarize_counts_ttft_from_arrival_and_keeps_send_ttft_apart() -> None:
    records = [
        rec(0, 2.0, 100, 0, "a", "cold", sent=0.0, e2e=2.5),
        rec(1, 4.0, 100, 50, "b", "cold", sent=1.0, e2e=4.5, due=0.5, capped=True),
        rec(2, 0.5, 100, 90, "a", "resend1", sent=5.0, e2e=1.0),
        rec(3, 1.5, 100, 90, "a", "resend2", sent=6.0, e2e=2.0),
        rec(4, None, 100, 0, "a", "resend2", error="HTTP 503", sent=7.0),
    ]
    s = report.summarize("x", records, {"a": 3, "b": 1, "c": 0, "d": 0})
    assert (s.requests, s.errors, s.capped) == (5, 1, 1)
    assert s.mean_ttft == pytest.approx(2.0) and s.mean_send_ttft == pytest.approx(1.875)
    assert s.p50_ttft == pytest.approx(1.75)
    assert s.hit_ratio == pytest.approx(230 / 400)
    assert s.throughput == pytest.approx(4 / 8.0)
    assert s.max_replica == 3 and math.isnan(s.max_work)
    assert s.by_tag["cold"] == pytest.approx(3.0) and s.by_tag["resent"] == pytest.approx(1.0)
    assert report.summarize("y", records).per_replica == {"a": 3, "b": 1}
    assert "x: 1 of 5 requests found the client's cap" in report.notes([s], {})[0]


def test_results_files_carry_the_caption_table_and_notes(tmp_path: Path) -> None:
    s = report.summarize("sys-1", [rec(0, 1.0, 10, 5, tag="cold"), rec(1, 3.0, 10, 5, tag="resend1")])
    caption = "**probe**, profile `rtx3090x2`, own pace (closed loop), seed 1"
    skipped = {"sys-2": "exited"}
    md = report.write_results(tmp_path / "p", "probe", {"seeds": [1]}, [s], {"sys-1": []}, skipped, caption)
    assert md.startswith(caption) and "| sys-1 | 2 | 0 | 2.00 |" in md and "resent s" in md
    assert "skipped sys-2: exited" in md and (tmp_path / "p" / "table.md").read_text() == md + "\n"
    doc, back = report.load_summaries(tmp_path / "p" / "summary.json")
    assert doc["workload"] == "probe" and back[0].system == "sys-1" and back[0].mean_ttft == s.mean_ttft
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["skipped"] == {"sys-2": "exited"}


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


def test_comparison_line_against_best_other_oracle_and_floor() -> None:
    rows = [summary("kvroute-cost", 1.0, 2.0, 0.45), summary("a", 3.0, 8.0), summary("b", 4.0, 6.0),
            summary("oracle", 0.5, 1.0), summary("floor", 0.25, 0.5)]  # fmt: skip
    line = report.comparison(rows)
    assert "mean TTFT 0.33x the best other non-oracle (a 3.00 s)" in line
    assert "p99 0.33x (b 6.00 s)" in line  # the best p99 is another system's
    assert "hit ratio 0.90x the oracle's" in line
    assert "mean TTFT 4.00x the floor (0.25 s; the best other non-oracle is 12.00x)" in line
    assert report.comparison(rows[1:]) == ""


def test_plots_are_written_as_png(tmp_path: Path) -> None:
    records = {
        "a": [rec(0, 1.0, 10, 5, "r1"), rec(1, 2.0, 10, 0, "r2")],
        "oracle": [rec(0, 0.5, 10, 10, "r1")],
    }
    summaries = [report.summarize(n, r, work={"r1": 1.0, "r2": 0.5}) for n, r in records.items()]
    plots.write_all(tmp_path, "w", summaries, records)
    series = {"rtx": {"a": [(0.3, 1.0), (0.6, 2.0)]}, "h200": {"a": [(0.6, 1.5)]}}
    plots.ttft_vs_load(tmp_path / "w.png", "w", series, {"rtx": [(0.3, 0.5), (0.6, 0.5)]})
    for path in (tmp_path / "ttft_cdf.png", tmp_path / "load.png", tmp_path / "w.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_aggregate_is_the_mean_over_seeds_of_systems_present_in_every_run() -> None:
    def row(name: str, ttft: float, hit: float, tag: float, err: float = float("nan")) -> report.Summary:
        return report.Summary(name, 10, 1, ttft, ttft, 2 * ttft, ttft, hit, 3.0, 4, 2 * ttft, 1.2,
                              {"r1": 4, "r2": 2}, {"r1": 2 * ttft, "r2": ttft}, {"t": tag}, 1,
                              model_error=err)  # fmt: skip

    runs = [
        [row("kvroute-cost", 1.0, 0.8, 2.0, 0.01), row("client-rr", 3.0, 0.5, 4.0), row("x", 9.0, 0.1, 1.0)],
        [row("client-rr", 5.0, 0.3, 6.0), row("kvroute-cost", 2.0, 0.6, 4.0, 0.03)],
    ]
    mean = report.aggregate(runs)
    assert [s.system for s in mean] == ["kvroute-cost", "client-rr"]  # "x" missed a seed
    cost = mean[0]
    assert (cost.requests, cost.errors, cost.max_replica, cost.capped) == (20, 2, 4, 2)
    assert cost.mean_ttft == pytest.approx(1.5) and cost.p99_ttft == pytest.approx(3.0)
    assert cost.hit_ratio == pytest.approx(0.7) and cost.by_tag == {"t": pytest.approx(3.0)}
    assert cost.max_work == pytest.approx(3.0) and cost.work_per_replica == {"#1": 3.0, "#2": 1.5}
    assert cost.per_replica == {"#1": 4, "#2": 2}
    assert cost.model_error == pytest.approx(0.02) and math.isnan(mean[1].model_error)
    assert report.comparison(mean).startswith(
        "kvroute-cost: mean TTFT 0.38x the best other non-oracle (client-rr 4.00 s); p99 0.38x"
    )
    assert report.aggregate([]) == []
