"""The cross-point summary and the README's fleet section, rebuilt from results written on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reports import summary
from bench.reports import tables as report
from bench.reports.readme import FLEET_BEGIN, FLEET_END


def _row(name: str, mean: float, p99: float) -> report.Summary:
    return report.Summary(name, 10, 0, mean, mean, p99, mean, 0.5, 1.0, 3, 2.0, 1.1)


def _point(out: Path, workload: str, profile: str, load: float | None, kv: float, seeds: list[int]) -> None:
    rows = [_row("kvroute-cost", kv, 4 * kv), _row("sglang-cache_aware", 2.0, 10.0),
            _row("client-rr", 3.0, 6.0), _row("oracle", 0.1, 0.2), _row("floor", 0.5, 1.0)]  # fmt: skip
    pace = "own-pace" if load is None else f"load-{load:g}"
    meta = {"profile": profile, "load": load, "seeds": seeds, "offered_load_cold": 2.5}
    caption = f"**{workload}**, profile `{profile}`, load {load}, seeds {seeds}"
    report.write_results(out / profile / pace / workload, workload, meta, rows, {}, {}, caption)


def test_summary_rows_plots_and_readme_section(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "results"
    _point(out, "rag", "rtx3090x2", 0.6, 6.0, [1, 2, 3])
    _point(out, "rag", "rtx3090x2", 0.3, 1.0, [1])
    _point(out, "rag", "h200", 0.6, 4.0, [1])
    _point(out, "probe", "rtx3090x2", None, 1.5, [1])
    (out / "rtx3090x2" / "load-0.6" / "rag" / "seed-1").mkdir()  # a seed's own results are not points
    readme = tmp_path / "bench" / "README.md"
    readme.write_text(
        f"# benches\n\n{FLEET_BEGIN}\nold tables\n{FLEET_END}\n\n## Gateway overhead\nkeep me\n"
    )
    md = summary.write_summary(out, readme, "kvroute bench", 125.0)
    rows = [r for r in (summary.row(p) for p in summary.collect(out)) if r is not None]
    expected = [("rag", "rtx3090x2", 0.3), ("rag", "rtx3090x2", 0.6), ("rag", "h200", 0.6)]
    assert [(r.workload, r.profile, r.load) for r in rows] == [*expected, ("probe", "rtx3090x2", None)]
    slow = rows[1]
    assert (slow.best_other, slow.best_other_mean) == ("sglang-cache_aware", 2.0)  # never the oracle
    assert slow.ratio == pytest.approx(3.0) and slow.vs_sglang == pytest.approx(3.0)
    assert slow.p99_ratio == pytest.approx(24 / 6)  # against the best p99 (client-rr's), not the best mean's
    assert slow.floor_multiple == pytest.approx(12.0) and slow.seeds == "1,2,3"
    assert rows[0].ratio == pytest.approx(0.5) and rows[0].best_other == "sglang-cache_aware"
    assert (
        "| rag | rtx3090x2 | 0.6 | 1,2,3 | 6.00 | sglang-cache_aware (2.00) | 3.00 | 4.00 | 3.00 | 12.00 |"
        in md
    )
    assert "| probe | rtx3090x2 | own pace |" in md
    assert (out / "plots" / "rag.png").read_bytes()[:4] == b"\x89PNG" and not (
        out / "plots" / "probe.png"
    ).exists()
    text = readme.read_text()
    assert "old tables" not in text and text.endswith("## Gateway overhead\nkeep me\n")
    assert "- `kvroute bench`: 2.1 min wall, 20" in text and md in text
    assert "![rag](results/plots/rag.png)" in text
    assert (
        text.count("**rag**, profile") == 3
        and "[table and plots](results/h200/load-0.6/rag/table.md)" in text
    )
    assert text.index("### rag") < text.index("### probe")


def test_the_runs_behind_the_results_accumulate(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "results"
    _point(out, "rag", "rtx3090x2", 0.6, 6.0, [1])
    readme = tmp_path / "bench" / "README.md"
    summary.write_summary(out, readme, "kvroute bench", 2832.0)
    summary.write_summary(out, readme, "kvroute bench rag --profile h200", 300.0)
    text = readme.read_text()
    assert text.index("- `kvroute bench`: 47.2 min wall") < text.index(
        "- `kvroute bench rag --profile h200`: 5.0"
    )
