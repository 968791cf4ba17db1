"""Several gateways, one replica's liveness (proxy/upstream/liveness.py; proxy/sync/shared_docs.py
``LoadPart``, ``adopt_last_bytes``): a request that one gateway sent to a replica streaming only to another
gateway's clients waits there past its first-byte deadline, through a real ``redis-server``, as it would if it
saw the bytes itself; and a gateway shares only the bytes it received (no echo keeps a replica alive)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from proxy.sync.shared_docs import adopt_last_bytes
from proxy.sync.state_sync import STATE_SYNC
from proxy.upstream.liveness import Liveness
from tests.conftest import StartGateway
from tests.proxy.conftest import EMU_FLAGS, MODEL, Emulators, wait_for
from tests.redis_server import RedisServer

DEADLINE = {"first_byte_timeout": 0.3, "first_byte_timeout_factor": 0.0, "first_byte_timeout_margin": 0.0}
REPLICA = "http://127.0.0.1:30000"


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4} | extra


async def test_a_request_queued_behind_another_gateways_stream_waits_on(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    """One running slot; a long answer streams through gateway a while gateway b's request waits for the
    slot, far past its 0.3 s first-byte deadline. b sees no byte of its own there: only a's shared
    last byte says the replica works. Without it b would abort the request at its deadline and send it
    again (a third generation, a retry, a failure on the replica's breaker)."""
    emu = await emulator_server(*EMU_FLAGS, "--max-running-requests", "1")
    await emu.fault(action="slow", factor=40)  # 10 ms per streamed token
    settings = {"health_interval": 0.1, "retries": 1, "state": redis_server.url} | DEADLINE
    a, b = [await gateway([emu.url], **settings) for _ in range(2)]
    for g in (a, b):
        await wait_for(lambda g=g: g.app[STATE_SYNC].ready.is_set(), 10)
    long = chat("long", stream=True, max_tokens=150)  # 150 tokens: ~1.5 s
    async with aiohttp.ClientSession() as s, s.post(a.url + "/v1/chat/completions", json=long) as r:
        await r.content.readuntil(b"\n\n")  # it runs
        async with s.post(b.url + "/v1/chat/completions", json=chat("queued", stream=True)) as q:
            body = await q.read()
            status = q.status
        assert (await r.read()).endswith(b"data: [DONE]\n\n")
    assert status == 200 and body.endswith(b"data: [DONE]\n\n"), body[-200:]
    metrics = b.gw.metrics.render().decode()
    assert f'kvroute_first_byte_waits_extended_total{{replica="{emu.url}"}} 1' in metrics
    assert "kvroute_retries_total{" not in metrics
    assert len(await emu.generations()) == 2  # never aborted: each request reached it once


@pytest.mark.parametrize("quiet", [0.0, 2.0])
def test_a_shared_last_byte_is_placed_by_its_wall_clock_time(quiet: float) -> None:
    """Read again before its next version, a document does not move the replica's last byte."""
    mine = Liveness(5.0)
    wall, now = time.time(), time.monotonic()
    table = {REPLICA: [0, 0, 0.0, 0.0, 0.0, 0, wall - quiet]}
    adopt_last_bytes({"other": table}, mine, now, wall)
    assert mine.working_until(REPLICA) == pytest.approx(now - quiet + 5.0)
    adopt_last_bytes({"other": table}, mine, now + 1.0, wall + 1.0)  # the same document, a second later
    assert mine.working_until(REPLICA) == pytest.approx(now - quiet + 5.0)
    assert mine.quiet_s(REPLICA, now) is None  # heard, not received: never exported again


def test_an_old_gateway_without_last_bytes_and_a_never_heard_replica_change_nothing() -> None:
    mine = Liveness(5.0)
    adopt_last_bytes(
        {"old": {REPLICA: [0, 0, 0.0, 0.0, 0.0, 0]}, "new": {REPLICA: [0] * 6 + [-1.0]}}, mine, 1.0, 2.0
    )
    assert mine.working_until(REPLICA) is None
