"""A real Prometheus for the tests: Debian's package, unpacked (never installed, so no service starts).

``prometheus_or_skip()`` returns (prometheus, promtool): from PATH when both are there, else from
``tests/artifacts/prometheus/`` where an earlier run unpacked them, else it fetches Debian's package with
``apt-get download`` (as root, where apt-get exists) and unpacks it there with ``dpkg-deb -x``. When
none of that works the test is skipped with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parents[1] / "artifacts" / "prometheus"
TIMEOUT_S = 300


def _cached() -> tuple[str, str] | None:
    binaries = CACHE / "usr" / "bin"
    found = (binaries / "prometheus", binaries / "promtool")
    return (str(found[0]), str(found[1])) if all(p.is_file() for p in found) else None


def _run(cmd: list[str], cwd: str) -> str | None:
    """None on success, else why not."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)} took more than {TIMEOUT_S} s"
    tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
    return None if done.returncode == 0 else f"{' '.join(cmd)} failed ({tail[0]})"


@functools.cache
def _find() -> tuple[str, str] | str:
    on_path = shutil.which("prometheus"), shutil.which("promtool")
    if on_path[0] and on_path[1]:
        return on_path[0], on_path[1]
    if cached := _cached():
        return cached
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb") or os.geteuid() != 0:
        return "Prometheus is not installed (Debian: apt-get install prometheus) and cannot be fetched here"
    with tempfile.TemporaryDirectory() as tmp:
        why = _run(["apt-get", "download", "prometheus"], tmp)
        if why is not None and _run(["apt-get", "update", "-qq"], tmp) is None:
            why = _run(["apt-get", "download", "prometheus"], tmp)
        if why is not None:
            return why
        (deb,) = Path(tmp).glob("prometheus_*.deb")
        CACHE.mkdir(parents=True, exist_ok=True)
        why = _run(["dpkg-deb", "-x", str(deb), str(CACHE)], tmp)
    return why or _cached() or "the prometheus package held no usr/bin/prometheus and promtool"


def prometheus_or_skip() -> tuple[str, str]:
    found = _find()
    if isinstance(found, str):
        pytest.skip(found)
    return found
