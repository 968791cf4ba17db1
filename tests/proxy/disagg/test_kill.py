"""A decode server killed mid-run (SIGKILL of its process): no request is lost that had not started
streaming; those that had are cut with one SSE error event; the pairs go on on the other decode server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from bench.systems.procs import ManagedProcess, free_ports
from tests.conftest import MODEL, Emulators, StartGateway
from tests.proxy.conftest import PLAIN_FLAGS
from tests.proxy.disagg.conftest import PREFILL_FLAGS

SLOW = ("--emu-time-scale", "0.5")  # 60 tokens decode in ~0.2 s: requests are in flight at the kill
REQUESTS, KILL_AFTER = 24, 10


async def one(url: str, i: int) -> tuple[bool, bool]:
    """(a content byte arrived, the answer ended well) of one streamed chat."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question {i} " * 30}],
        "max_tokens": 60,
    }
    body |= {"stream": True, "seed": i}
    started = False
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return False, False
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                started = True
            if line.startswith(b'data: {"error"'):
                return started, False
            if line.startswith(b"data: [DONE]"):
                return started, True
    return started, False


async def test_a_decode_killed_mid_run_loses_no_request_that_had_not_started_streaming(
    emulator_server: Emulators, gateway: StartGateway, tmp_path: Path
) -> None:
    prefill = await emulator_server(*PREFILL_FLAGS)
    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    flags = [f for f in PLAIN_FLAGS if f != "--emu-enable-faults"]
    i = flags.index("--emu-time-scale")
    flags[i + 1] = SLOW[1]
    argv = [
        sys.executable,
        "-m",
        "emulator",
        "--host",
        "127.0.0.1",
        *flags,
        "--disaggregation-mode",
        "decode",
    ]
    decodes = [
        ManagedProcess([*argv, "--port", str(p)], [u], tmp_path / f"d{p}.log")
        for p, u in zip(ports, urls, strict=True)
    ]
    async with decodes[0], decodes[1]:
        gw = await gateway([], prefill=(prefill.url,), decode=tuple(urls), health_interval=0.1, retries=3)
        tasks = []
        for n in range(REQUESTS):
            tasks.append(asyncio.create_task(one(gw.url, n)))
            await asyncio.sleep(0.01)
            if n == KILL_AFTER:
                assert decodes[0].pid is not None
                os.kill(decodes[0].pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
    lost = [n for n, (started, ok) in enumerate(results) if not ok and not started]
    cut = [n for n, (started, ok) in enumerate(results) if not ok and started]
    assert lost == []
    assert sum(ok for _, ok in results) == REQUESTS - len(cut)
    retried = 'kvroute_pd_pair_failures_total{side="decode"}' in gw.metrics()
    assert retried or cut  # the kill met requests in flight there
