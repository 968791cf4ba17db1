"""bench.ab: two git revisions of the gateway side by side on the same fleets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import ab
from bench.runs.plan import Point

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "point"),
    [
        ("rag:0.6", Point("rtx3090x2", 0.6, (1,), ("rag",))),
        ("mixed:0.9:h200", Point("h200", 0.9, (1,), ("mixed",))),
        ("agent", Point("rtx3090x2", None, (1,), ("agent",))),
    ],
)
def test_points(text: str, point: Point) -> None:
    assert ab.parse_point(text) == point


def test_a_point_needs_a_known_workload_and_a_number() -> None:
    for bad in (["HEAD", "HEAD", "nosuch:0.6"], ["HEAD", "HEAD", ":0.6"]):
        with pytest.raises(SystemExit):
            ab.parse(bad)
    with pytest.raises(ValueError):
        ab.parse_point("rag:high")


def _run(pair: int, point: str, system: str, mean: float | None, p99: float = 1.0) -> dict[str, Any]:
    return {"pair": pair, "point": point, "seed": 1, "system": system, "mean": mean, "p99": p99, "hit": 0.5}


def test_table_gives_each_pair_its_ratio_and_the_geomeans() -> None:
    rows = [
        _run(0, "rag:0.6", "b", 2.0), _run(0, "rag:0.6", "c", 1.0, 0.5),
        _run(1, "rag:0.6", "c", 4.0), _run(1, "rag:0.6", "b", 1.0),  # the same point again, other order
        _run(2, "hot:0.9", "b", 1.0), _run(2, "hot:0.9", "c", None),  # the candidate was skipped
    ]  # fmt: skip
    md = ab.table(rows, "b", "c")
    assert "| rag:0.6 | 1 | 2.000 | 1.000 | 0.500 | 0.500 | 0.500, 0.500 |" in md
    assert "| rag:0.6 | 1 | 1.000 | 4.000 | 4.000 | 1.000 |" in md
    assert "| rag:0.6 | 2 | 1.414 |" in md.split("geomean")[1]  # sqrt(0.5 x 4)
    assert "hot:0.9 | 1 |" not in md
    assert "| all | 2 | 1.414 |" in md


def test_the_gateway_runs_its_own_worktree_whatever_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "__init__.py").write_text("")
    system = ab.gateway("base", tmp_path, with_events=False)
    probe = [sys.executable, "-c", "import proxy; print(proxy.__file__)"]
    out = subprocess.run(probe, cwd=REPO, env={**os.environ, **system.env}, capture_output=True, text=True)
    assert out.stdout.strip() == str(tmp_path / "proxy" / "__init__.py")  # not the checkout's proxy/
    assert "--tokenizer-path" in ab.gateway("x", tmp_path, with_events=True).command


def test_two_revisions_run_side_by_side_and_their_worktrees_go(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ab.main(["HEAD", "HEAD", "noreuse:0.6", "--quick", "--out", str(out)]) == 0
    md = (out / "ab.md").read_text()
    assert "| noreuse:0.6 | 1 |" in md and "| all | 1 |" in md
    runs = (out / "ab.jsonl").read_text().splitlines()
    assert len(runs) == 2 and all('"requests": 60' in r and '"errors": 0' in r for r in runs)
    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True)
    assert "kvroute-ab-" not in listed.stdout
