"""What the deploy tests read: the compose file, kustomize renders, the SGLang launch template's argv.

- ``compose()``: deploy/compose/docker-compose.yml as YAML (anchors resolved by the loader).
- ``kustomize(path)``: ``kubectl kustomize deploy/k8s/<path>`` as a list of objects. kubectl comes with
  this machine image (its Kustomize is v5.5); without it the caller skips, except under CI (CI=true),
  where a missing tool must fail rather than pass silently.
- ``launch_argv(env)``: deploy/sglang/launch.sh's command line for an environment (``DRY_RUN=1``).
- ``caching_flags(argv)``: the flags that decide how a replica caches (HiCache, KV dtype, chunking,
  reports), as {flag: value} (True for a switch), to compare one launch line with another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
LAUNCH = DEPLOY / "sglang" / "launch.sh"
CACHING = (
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "--hicache-ratio",
    "--hicache-size",
    "--hicache-io-backend",
    "--hicache-storage-backend",
    "--kv-cache-dtype",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--enable-cache-report",
    "--enable-metrics",
)


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl (kustomize) is missing on the CI machine: the manifests cannot be rendered")
        pytest.skip("kubectl is not installed: cannot render the kustomize manifests")
    return path


def kustomize(path: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "k8s" / path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def launch_argv(env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    done = subprocess.run(
        ["bash", str(LAUNCH)],
        env={**clean, **env, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def env_file(name: str) -> dict[str, str]:
    """A deploy/sglang/*.env file as the shell reads it (``set -a; . FILE``)."""
    script = f"set -a; . {DEPLOY / 'sglang' / name}; env -0"
    out = subprocess.run(["bash", "-c", script], env={}, capture_output=True, timeout=30, check=True).stdout
    pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k not in ("PWD", "SHLVL", "_", "OLDPWD")}


def caching_flags(argv: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for i, arg in enumerate(argv):
        if arg in CACHING:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
            out[arg] = value
    return out
