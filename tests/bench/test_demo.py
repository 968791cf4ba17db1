"""`kvroute demo` end to end: emulated replicas, `kvroute serve` as a subprocess, the printed table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import demo

pytestmark = pytest.mark.slow


@pytest.mark.timeout(90)
def test_demo_prints_one_column_per_policy_and_every_request_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--policies", "cost,round_robin", "--time-scale", "0.03", "--logs", str(tmp_path)]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[1].strip(): line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["requests"][-2:] == ["22", "22"] and rows["errors"][-2:] == ["0", "0"]
    per_replica = re.findall(r"(\d+) / (\d+) / (\d+)", out)
    assert len(per_replica) == 2 and all(sum(map(int, counts)) == 22 for counts in per_replica)
    cost, rr = (float(x.rstrip("%")) for x in rows["cached tokens (token-weighted)"][-2:])
    assert cost > rr  # the prefix-aware policy reuses more than round robin on the shared prompts
    assert "kvroute ready" in (tmp_path / "kvroute-cost.log").read_text()


def test_demo_rejects_an_unknown_policy_with_the_gateways_own_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--policies", "nosuch", "--logs", str(tmp_path)]) == 2
    assert "nosuch" in capsys.readouterr().err
