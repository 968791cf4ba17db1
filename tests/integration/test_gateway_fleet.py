"""The gateway's fleet with real emulator processes: a killed replica leaves the pool while requests
keep succeeding, and a replica added through the admin API gets traffic."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import openai
import pytest

from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import free_ports
from tests.conftest import StartGateway

MODEL = "emu-model"
EMU_ARGS = ["--served-model-name", MODEL, "--emu-time-scale", "0.01"]


async def _chat(client: openai.AsyncOpenAI, i: int) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=2
    )
    raw.parse()
    return raw.headers["x-kvroute-replica"]


async def test_killed_replica_leaves_the_pool_and_requests_keep_succeeding(gateway: StartGateway) -> None:
    async with EmulatorFleet(2, EMU_ARGS) as stable, EmulatorFleet(1, EMU_ARGS) as doomed:
        backends = (*stable.urls, *doomed.urls)
        gw = await gateway(backends, policy="round_robin", health_interval=0.2, retries=2)
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as c:
            first = Counter([await _chat(c, i) for i in range(6)])
            assert set(first) == set(backends)
            await asyncio.to_thread(doomed.stop)  # killed mid-run, no warning
            # every request still succeeds: the first one to hit the dead replica is retried elsewhere
            after = Counter([await _chat(c, i) for i in range(12)])
            assert set(after) == set(stable.urls)
            replica = gw.gw.fleet.get(doomed.urls[0])
            assert replica is not None and not replica.healthy


async def test_replica_added_through_admin_api_gets_traffic(gateway: StartGateway) -> None:
    async with EmulatorFleet(1, EMU_ARGS) as base, EmulatorFleet(1, EMU_ARGS) as extra:
        gw = await gateway(base.urls, policy="least_load", admin_key="k", health_interval=0.5)
        url = gw.url
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            assert {await _chat(c, i) for i in range(3)} == set(base.urls)
            admin = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
            async with admin:
                added = await admin.post(
                    "/admin/replicas", body={"url": extra.urls[0]}, cast_to=dict[str, object]
                )
            assert added["replica"]["healthy"] is True  # type: ignore[index]
            # concurrent requests: least_load spreads them over both replicas
            seen = Counter(await asyncio.gather(*(_chat(c, i) for i in range(16))))
            assert seen[extra.urls[0]] >= 4 and seen[base.urls[0]] >= 4


def test_kvroute_serve_subprocess(tmp_path: Path) -> None:
    """``kvroute serve`` as users run it: TOML + env + flags, ready line, serves, stops on SIGTERM."""
    with EmulatorFleet(1, EMU_ARGS) as emu:
        port = free_ports(1)[0]
        cfg = tmp_path / "kvroute.toml"
        cfg.write_text(f'backend = ["{emu.urls[0]}"]\npolicy = "round_robin"\nport = 1\n')
        env = dict(os.environ, KVROUTE_ADMIN_KEY="secret-key", KVROUTE_LOG_LEVEL="info")
        cmd = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(cfg), "--port", str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline().split()  # kvroute ready URL TIMESTAMP
            assert ready[:3] == ["kvroute", "ready", f"http://127.0.0.1:{port}"]
            assert time.strptime(ready[3], "%Y-%m-%dT%H:%M:%S%z")
            url = f"http://127.0.0.1:{port}/status"
            with pytest.raises(urllib.error.HTTPError, match="401"):  # behind the admin key
                urllib.request.urlopen(url, timeout=5)
            auth = {"Authorization": "Bearer secret-key"}
            with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=5) as r:
                status = json.loads(r.read())
            assert status["policy"] == "round_robin" and status["healthy_replicas"] == 1
            assert status["config"]["admin_key"] == "***"
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=10)
        assert "secret-key" not in err and '"admin_key": "***"' in err  # settings logged once, redacted
