"""`kvroute emulate --version` and `--help` answer and exit 0 instead of starting a replica."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from emulator.config import SGLANG_VERSION

KVROUTE = str(Path(sys.executable).with_name("kvroute"))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The command, bounded: a replica that started serving instead would time out (and fail)."""
    return subprocess.run(
        [KVROUTE, "emulate", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_version_prints_one_line_and_exits_0() -> None:
    done = _run("--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvroute emulate ")
    assert f"SGLang {SGLANG_VERSION}" in lines[0]
    assert "ready" not in done.stdout and "ignoring" not in done.stderr


def test_help_prints_the_flags_and_exits_0() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kvroute emulate")
    assert "--version" in done.stdout and "--enable-response-store" in done.stdout
