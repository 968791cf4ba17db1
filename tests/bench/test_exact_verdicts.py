"""bench.exact's verdicts: the mean over seeds decides, each seed's ratio is shown beside it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bench import exact
from bench.reports.tables import Summary
from bench.runs import plan


def _summary(system: str, mean_ttft: float, error: float = 0.001) -> Summary:
    return Summary(system, 200, 0, mean_ttft, mean_ttft, 2 * mean_ttft, mean_ttft, 0.7, 5.0, 60, 30.0, 1.1,
                   model_error=error, engine_loss=0.0)  # fmt: skip


def _write(directory: Path, ttfts: dict[str, float], error: float = 0.001) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [asdict(_summary(name, t, error)) for name, t in ttfts.items()]
    (directory / "summary.json").write_text(json.dumps({"workload": "rag", "meta": {}, "summaries": rows}))


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_several_seeds_judge_the_mean_and_show_each_seeds_ratio(tmp_path: Path) -> None:
    (pt,) = exact.points(["rag"], (1, 2))
    where = tmp_path / pt.directory / "rag"
    _write(where, {"kvroute-cost": 5.0, "kvroute-tokens": 5.2, "kvroute-exact": 5.1})
    _write(where / "seed-1", {"kvroute-cost": 5.0, "kvroute-tokens": 5.5, "kvroute-exact": 5.5})
    _write(where / "seed-2", {"kvroute-cost": 5.0, "kvroute-tokens": 4.9, "kvroute-exact": 4.7})
    (row,) = exact.verdict_rows(tmp_path, (pt,))
    cells = _cells(row)
    assert cells[5] == "1.02x (1.10, 0.96)"  # 5.1 / 5.0 on the means; 5.5 / 5.0 and 4.7 / 4.9 per seed
    assert cells[6:] == ["PASS", "PASS"]


def test_one_seed_shows_its_ratio_alone_and_misses_past_the_tolerance(tmp_path: Path) -> None:
    (pt,) = exact.points(["rag"])
    _write(
        tmp_path / pt.directory / "rag",
        {"kvroute-cost": 5.0, "kvroute-tokens": 5.2, "kvroute-exact": 5.5},
        0.01,
    )
    cells = _cells(exact.verdict_rows(tmp_path, (pt,))[0])
    assert cells[5:] == ["1.10x", "MISS", "MISS"]


def test_a_missing_seed_reads_na(tmp_path: Path) -> None:
    (pt,) = exact.points(["rag"], (1, 2))
    where = tmp_path / pt.directory / "rag"
    _write(where, {"kvroute-cost": 5.0, "kvroute-exact": 5.0})
    _write(where / "seed-2", {"kvroute-cost": 5.0, "kvroute-exact": 4.5})
    assert _cells(exact.verdict_rows(tmp_path, (pt,))[0])[5] == "1.00x (n/a, 0.90)"


@pytest.mark.parametrize("text", ["1,x", "1,1", "", " , "])
def test_bad_seeds_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        plan.seeds_arg(text)


def test_seeds_may_carry_spaces() -> None:
    assert plan.seeds_arg("1, 2,3") == (1, 2, 3)


def test_seeds_reach_the_points() -> None:
    args = exact.parse(["rag", "--seeds", "1,2,3"])
    assert [p.seeds for p in exact.points(args.workloads, args.seeds)] == [(1, 2, 3)]
