"""``bench.labs.soak`` end to end, shortened: Redis, 4 emulated replicas, kvroute with --state and faults
every 2 s for 8 s; nothing is lost and the table and plot are written."""

from __future__ import annotations

import re
from pathlib import Path

from bench.labs.soak import main
from bench.systems.redis_proc import executable


def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    executable()  # redis-server is installed (RedisNotInstalled otherwise)
    argv = ["--minutes", str(8 / 60), "--fault-every", "2", "--sample-every", "1", "--workers", "4"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "soak.md").read_text()
    assert re.search(r"\| lost requests [^|]*\| \*\*0\*\* \|", text), text
    assert re.search(r"\| ok \| [1-9]\d* \|", text), text
    assert "| gateway still running at the end | yes |" in text
    assert (tmp_path / "soak.png").stat().st_size > 1000
