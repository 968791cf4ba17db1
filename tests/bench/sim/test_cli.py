"""`kvroute bench sim` end to end on one scenario: its reports, and its errors for bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main as bench_main


def test_one_scenario_writes_its_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["sim", "--seed", "1002", "--systems", "cost,round_robin", "--out", str(tmp_path)]) == 0
    out = tmp_path / "seed-1002"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["set"] == "seed-1002" and summary["scenarios_run"] == 1
    row = summary["scenarios"][0]
    assert set(row["systems"]) == {"cost", "round_robin"}
    cost, rr = row["systems"]["cost"]["mean_s"], row["systems"]["round_robin"]["mean_s"]
    assert row["ratio_mean"] == pytest.approx(cost / rr) and row["best_other"] == "round_robin"
    assert summary["geomean_ratio_mean"] == pytest.approx(row["ratio_mean"])
    assert (out / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "summary.md").read_text()
    assert "| 1002 | chat | 3 |" in table and "## Worst scenarios" in table
    runs = json.loads((out / "scenarios" / "1002.json").read_text())["runs"]
    assert [len(r["requests"]) for r in runs] == [600, 600]
    captured = capsys.readouterr()
    assert "[1/1] seed 1002" in captured.err
    assert "| seed-1002 | 1 |" in captured.out


@pytest.mark.parametrize(
    "argv", [["--systems", "cost,nope"], ["--jobs", "0"], ["--set", "other"], ["--systems", ""]]
)
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["sim", *argv])
    assert exc.value.code == 2
    assert "kvroute bench sim" in capsys.readouterr().err
