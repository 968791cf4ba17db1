"""A real headless Chromium for page tests: Debian's ``chromium`` driven by Playwright (no browser download).

``chromium_or_skip()`` returns the executable, installing Debian's package with apt-get when it is
missing and the tests run as root (CI's machines: ``.ci/run`` tries first); otherwise the test is skipped
with the reason. Chromium starts with the flags this machine needs (no sandbox as root, no GPU, no
background networking: the network is closed, and connections to Google's hosts would be refused).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
APT_TIMEOUT_S = 600


def _find() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@functools.cache
def _install() -> str:
    """The executable, or why there is none ('' + reason is returned as 'skip:<reason>')."""
    found = _find()
    if found:
        return found
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return (
            "skip:Chromium is not installed (Debian: apt-get install chromium) and cannot be installed here"
        )
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, timeout=APT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return f"skip:{' '.join(cmd)} took more than {APT_TIMEOUT_S} s"
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            return f"skip:{' '.join(cmd)} failed ({tail[0]})"
    return _find() or "skip:apt-get installed chromium but no chromium executable is on PATH"


def chromium_or_skip() -> str:
    pytest.importorskip("playwright.async_api", reason="Playwright (a test extra) is not installed")
    found = _install()
    if found.startswith("skip:"):
        pytest.skip(found.removeprefix("skip:"))
    return found
