"""`kvroute bench overhead` end to end at a tiny scale: one run against a real emulated replica and a real
kvroute, its report, table and plot, and figures consistent with the run's own results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main as bench_main

TINY = ["--scale", "0.005", "--runs", "1", "--rounds", "1", "--concurrency", "2", "--wide", "3",
        "--no-router", "--no-round-robin", "--no-scrape"]  # fmt: skip


def test_a_tiny_run_writes_a_consistent_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "overhead",
        *TINY,
        "--label",
        "tiny",
        "--kvroute-args",
        "--log-level warning",
        "--out",
        str(tmp_path),
    ]
    assert bench_main(argv) == 0
    doc = json.loads((tmp_path / "overhead-tiny.json").read_text())
    assert doc["meta"]["label"] == "tiny" and doc["meta"]["kvroute_args"] == ["--log-level", "warning"]
    assert doc["meta"]["kvroute"].endswith("--policy cost --log-level warning")
    (run,) = doc["runs"]
    keys = [(r["scenario"], r["concurrency"], r["target"]) for r in run]
    assert keys == [(c, n, t) for c, n in CASES for t in ("direct", "kvroute")]
    assert all(r["requests"] >= 4 and r["errors"] == 0 for r in run)
    by = {(r["scenario"], r["concurrency"], r["target"]): r for r in run}
    for row in doc["rows"]:
        own, direct = (
            by[(row["case"], row["concurrency"], row["target"])],
            by[(row["case"], row["concurrency"], "direct")],
        )
        assert row["per_run"]["p50_ms"] == [own["p50_ms"]] and row["median"]["p50_ms"] == own["p50_ms"]
        assert row["median"]["added_p50_ms"] == pytest.approx(own["p50_ms"] - direct["p50_ms"])
        assert row["median"]["kept"] == pytest.approx(own["rps"] / direct["rps"])
        assert row["median"]["cpu_ms"] >= 0
    kv = [row for row in doc["rows"] if row["target"] == "kvroute"]
    assert [len(row["verdicts"]) for row in kv] == [2, 1, 1, 1, 1, 0]
    assert kv[1]["verdicts"][0]["met"] is None  # kept vs sglang-router: not measured
    assert kv[1]["verdicts"][0]["value"] is None and kv[1]["median"]["kept_vs_peer"] is None
    md = (tmp_path / "overhead-tiny.md").read_text()
    assert (
        md.startswith("# Gateway overhead (tiny)") and "| 40K prompts, each different | 1 | kvroute |" in md
    )
    assert (tmp_path / "overhead-tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert "overhead: run 1/1" in captured.err and "64-token stream" in captured.err
    assert "| case | conc | target |" in captured.out


CASES = [("small chat", 1), ("small chat", 2), ("small chat", 3), ("64-token stream", 1),
         ("40K prompt repeated", 1), ("40K prompts, each different", 1)]  # fmt: skip


def test_kvroute_args_reach_its_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["overhead", *TINY, "--kvroute-args=--no-such-flag", "--out", str(tmp_path)]
    assert bench_main(argv) == 1
    assert "did not start" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--label", "a b"], ["--scale", "-1"]])
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["overhead", *argv])
    assert exc.value.code == 2 and "kvroute bench overhead" in capsys.readouterr().err
