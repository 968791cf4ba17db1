"""The live stack the docs' client snippets run against, and how they are run there.

The stack: two emulated SGLang replicas serving ``qwen3-8b`` (HiCache write_back, cache reports and
metrics on, time 1000x faster than modelled) and one kvroute gateway over them with an admin key and a
public status page (on docs/security.md's blocks also that page's client keys). The docs' addresses are
rewritten to the stack's: ``http://127.0.0.1:8080`` (the gateway) and ``http://127.0.0.1:30000`` /
``:30001`` (the replicas).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from proxy.cli import main as kvroute_main
from tests.conftest import Emulators, StartGateway
from tests.diag.cli import run_main
from tests.docs.commands import environment, expand, split_env
from tests.docs.snippets import ROOT

ADMIN_KEY = "docs-admin-key"
REPLICA_FLAGS = (
    "--served-model-name",
    "qwen3-8b",
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "write_back",
    "--enable-cache-report",
    "--enable-metrics",
    "--emu-time-scale",
    "0.001",
)
DOCS_GATEWAY = "http://127.0.0.1:8080"
DOCS_REPLICAS = ("http://127.0.0.1:30000", "http://127.0.0.1:30001")
CURL = 'curl() { command curl --silent --show-error --fail-with-body --max-time 20 "$@"; }'


@dataclass(frozen=True, slots=True)
class Stack:
    """Where the docs' addresses point in this test."""

    urls: Mapping[str, str]

    def rewrite(self, text: str) -> str:
        for docs_url, url in self.urls.items():
            text = text.replace(docs_url, url)
        return text

    @property
    def env(self) -> dict[str, str]:
        return environment({"KVROUTE_ADMIN_KEY": ADMIN_KEY})


async def start(emulator_server: Emulators, gateway: StartGateway, api_keys: Path | None) -> Stack:
    replicas = [await emulator_server(*REPLICA_FLAGS) for _ in DOCS_REPLICAS]
    keys = {"api_keys": str(api_keys)} if api_keys else {}
    gw = await gateway([r.url for r in replicas], admin_key=ADMIN_KEY, public_status=True, **keys)
    urls = {DOCS_GATEWAY: gw.url, **{d: r.url for d, r in zip(DOCS_REPLICAS, replicas, strict=True)}}
    return Stack(urls)


async def run_python(stack: Stack, source: str, path: Path, line: int) -> None:
    """A Python block, its addresses rewritten, run in a thread (the stack runs on this event loop);
    a traceback names the page's own lines."""
    code = compile("\n" * line + stack.rewrite(source), str(path.relative_to(ROOT)), "exec")
    await asyncio.to_thread(exec, code, {"__name__": "__docs__"})


async def run_curl(stack: Stack, command: str) -> None:
    """A curl line run by bash as written, with curl failing on an HTTP error (status >= 400)."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    script = f"set -o pipefail; {CURL}; {stack.rewrite(command)}"
    proc = await asyncio.create_subprocess_exec("bash", "-c", script, env=stack.env, cwd=ROOT)
    assert await asyncio.wait_for(proc.wait(), 30) == 0, command


async def run_kvroute(stack: Stack, command: str) -> None:
    """A kvroute client command (status --once, warm, probe, ab): its real main, in a thread."""
    env, argv = split_env(expand(stack.rewrite(command), stack.env))
    with mock.patch.dict(os.environ, env):
        code, out, err = await run_main(kvroute_main, *argv[1:])
    assert code == 0, f"{command}: exit status {code}\n{out}\n{err}"
