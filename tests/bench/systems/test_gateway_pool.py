"""bench.systems.gateway_pool with real processes: two kvroute gateways sharing a real redis-server, the
client's round robin, and a restart on the same port that skips the gateway while it is down."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiohttp
import orjson
import pytest

from bench.systems.fleet import EmulatorFleet
from bench.systems.gateway_pool import GatewayPool, StateStore
from bench.systems.procs import replica_id
from bench.workloads.generators import CHAT, TimedRequest
from tests.redis_server import RedisServer


def request(i: int) -> TimedRequest:
    """~3000 tokens: at the fleet's time scale a cold prefill (~40 ms) is far from a hit, beyond the
    cost policy's tie tolerance (5 ms), so a repeat goes to its holder for its cache, not by a tie-break."""
    body = {"model": "default", "messages": [{"role": "user", "content": f"q{i} " * 3000}], "max_tokens": 4}
    return TimedRequest(i, 0.0, f"s{i}", CHAT, body, 3000, "t")


async def ask(url: str, req: TimedRequest) -> str:
    async with aiohttp.ClientSession() as http, http.post(url + req.path, json=req.body) as resp:
        assert resp.status == 200
        return resp.headers["x-kvroute-replica"]


@pytest.mark.slow
async def test_a_restarted_gateway_comes_back_on_its_port_with_the_shared_view(tmp_path: Path) -> None:
    redis = RedisServer().start()
    try:
        async with (
            EmulatorFleet(2, ["--emu-time-scale", "0.05"], tmp_path / "emu.log") as fleet,
            GatewayPool(2, fleet.urls, tmp_path, StateStore(redis.url, uuid.uuid4().hex)) as pool,
        ):
            first = [await ask(pool.choose(request(i)), request(i)) for i in range(4)]
            await asyncio.sleep(0.3)  # a few sync rounds
            async with aiohttp.ClientSession() as http:
                for i in (0, 1):  # a repeat: both gateways name its holder
                    await pool.preview(http, request(i), orjson.dumps(request(i).body), False)
            assert pool.previews == {i: (replica_id(first[i]),) * 2 for i in (0, 1)}
            port = pool.ports[1]
            restarting = asyncio.create_task(pool.restart(1))
            await asyncio.sleep(0.2)  # #1 is stopping or starting: its turns go to #0
            down = [pool.choose(request(i)) for i in (90, 91)]
            restart = await restarting
            again = [await ask(pool.choose(request(i)), request(i)) for i in range(4, 8)]
            repeats = [await ask(pool.urls[1], request(i)) for i in range(4)]
    finally:
        redis.stop()
    assert pool.ports[1] == port and restart.state["state"] == "synced"
    assert restart.state["applied_events"] >= 2  # what #0 routed, replayed from Redis before it was ready
    assert down == [pool.urls[0]] * 2
    assert [s.gateway for s in pool.sends] == [0, 1, 0, 1, 0, 0, 1, 0, 1, 0]
    assert [s.generation for s in pool.sends] == [0, 0, 0, 0, 0, 0, 1, 0, 1, 0]
    assert repeats == first and len(again) == 4  # the restarted one sends repeats to their holders
