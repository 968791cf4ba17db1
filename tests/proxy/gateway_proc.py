"""``kvroute serve`` as a subprocess of an async test (its replicas may run in the test's own loop, so
nothing here blocks): started with flags, its ready line read (unless ``ready=False``: the test reads
``proc.stdout`` itself), stopped by PID at the end."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

READY_TIMEOUT_S = 20.0


class GatewayProcess:
    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    async def exit_status(self, timeout_s: float) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout_s)


@contextlib.asynccontextmanager
async def gateway_process(log: Path, *flags: str, ready: bool = True) -> AsyncIterator[GatewayProcess]:
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", "0", "--log-level", "info", *flags]
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        if not ready:
            yield GatewayProcess(proc, "", log)
            return
        line = (await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)).decode().strip()
        assert line.startswith("kvroute ready "), line  # else: see the log
        yield GatewayProcess(proc, line.split()[2], log)  # kvroute ready URL TIMESTAMP
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
