"""Replica control through the admin API: what reaches the recording replicas, and the router told when
a replica's cache is emptied (``proxy/admin/control.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import Emulators, Gw, StartGateway
from tests.proxy.conftest import ADMIN, EMU_FLAGS, SYSTEM
from tests.proxy.observe.test_metrics import chat
from tests.proxy.recorder import Recorder


@dataclass
class Controlled:
    gw: Gw
    recorders: list[Recorder]
    urls: list[str]

    def controls(self) -> list[tuple[str, str, bytes]]:
        """(replica, target, body) of every control request that arrived, in order."""
        return [(u, s.target, s.body) for u, r in zip(self.urls, self.recorders, strict=True)
                for s in r.client_requests() if not s.path.startswith(("/v1/", "/generate"))]  # fmt: skip


@pytest.fixture
async def fleet(emulator_server: Emulators, gateway: StartGateway) -> AsyncIterator[Controlled]:
    async with AsyncExitStack() as exits:
        recorders = [Recorder((await emulator_server(*EMU_FLAGS)).url) for _ in range(2)]
        urls = [await exits.enter_async_context(r.running()) for r in recorders]
        gw = await gateway(urls, health_interval=0.1, admin_key=ADMIN["Authorization"][7:], policy="cost")
        yield Controlled(gw, recorders, urls)


async def _control(url: str, action: str, doc: Any, headers: dict[str, str] = ADMIN) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/admin/control/{action}", json=doc, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_flush_reaches_one_replica_and_restarts_its_cache_model(fleet: Controlled) -> None:
    for i in range(4):
        assert (await chat(fleet.gw.url, f"question {i} " + SYSTEM["content"], stream=False))[0] == 200
    held = fleet.gw.gw.router.status().replicas
    target = next(r for r in fleet.urls if held[r].gpu.tokens > 0)
    status, doc = await _control(fleet.gw.url, "flush_cache", {"url": target})
    assert status == 200 and doc["replicas"][target]["status"] == 200
    assert fleet.controls() == [(target, "/flush_cache", b"{}")]
    assert fleet.gw.gw.router.status().replicas[target].gpu.tokens == 0


async def test_an_action_goes_to_every_healthy_replica_with_its_body(fleet: Controlled) -> None:
    status, doc = await _control(fleet.gw.url, "abort_request", {"body": {"rid": "r1", "abort_all": False}})
    assert status == 200 and set(doc["replicas"]) == set(fleet.urls)
    want = orjson.dumps({"rid": "r1", "abort_all": False})
    assert sorted(fleet.controls()) == sorted((u, "/abort_request", want) for u in fleet.urls)


async def test_the_gateways_flush_forwards_only_the_timeout(fleet: Controlled) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(fleet.gw.url + "/flush_cache?timeout=2&x=1", headers=ADMIN) as r,
    ):
        doc = await r.json()
        assert r.status == 200 and doc["flushed"] is True and set(doc["replicas"]) == set(fleet.urls)
    assert {t for _, t, _ in fleet.controls()} == {"/flush_cache?timeout=2"}


@pytest.mark.parametrize(
    ("action", "doc", "headers", "status"),
    [
        ("flush_cache", {}, {"Authorization": "Bearer sk-client"}, 401),
        ("flush_cache", {}, {}, 401),
        ("exec", {}, ADMIN, 404),
        ("flush_cache", {"url": "http://127.0.0.1:1"}, ADMIN, 404),
        ("flush_cache", {"path": "/x"}, ADMIN, 400),
        ("abort_request", {"body": ["rid"]}, ADMIN, 400),
        ("flush_cache", {"timeout": 0}, ADMIN, 400),
    ],
)
async def test_refusals_reach_nothing(
    fleet: Controlled, action: str, doc: Any, headers: dict[str, str], status: int
) -> None:
    assert (await _control(fleet.gw.url, action, doc, headers))[0] == status
    assert fleet.controls() == []
