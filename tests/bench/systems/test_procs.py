"""bench.systems.procs with real processes: readiness, the log tail of a process that died, stop by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ManagedProcess, NotReady, free_ports, served_model, stop_process
from tests.conftest import serve


def test_a_process_that_exits_is_not_ready_and_its_log_tail_says_why() -> None:
    code = "import sys; print('boom: no backend given', file=sys.stderr); sys.exit(3)"
    proc = ManagedProcess([sys.executable, "-c", code], ["http://127.0.0.1:9"], ready_timeout_s=20)
    with pytest.raises(NotReady, match=r"exited with code 3.*boom: no backend given"):
        proc.start()
    assert proc.pid is None


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace_period() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True)"
    code += "; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    t0 = time.monotonic()
    stop_process(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 5
    proc.stdout.close()


async def test_emulator_fleet_is_ready_serves_its_model_and_stops_by_pid(tmp_path: Path) -> None:
    log = tmp_path / "emu.log"
    async with EmulatorFleet(2, ["--emu-time-scale", "0.001", "--served-model-name", "m1"], log) as fleet:
        assert len(set(fleet.ports)) == 2 and fleet.pid is not None
        assert [await served_model(u) for u in fleet.urls] == ["m1", "m1"]
        pid = fleet.pid
    assert fleet.pid is None and "ready" in log.read_text()
    with pytest.raises(ProcessLookupError):  # the PID we started is gone (reaped)
        os.kill(pid, 0)


async def test_served_model_is_none_without_a_model_list() -> None:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with serve(app) as url:
        assert await served_model(url) is None
    assert len(set(free_ports(8))) == 8
