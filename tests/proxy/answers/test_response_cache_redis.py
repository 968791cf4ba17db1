"""The exact-response cache in a real ``redis-server`` (started per test on a free port, stopped by
PID): answers shared by gateways, the TTL as Redis' own expiry, keys free of prompt text, and Redis
going away and coming back while requests keep being answered."""

from __future__ import annotations

import asyncio
import logging
import re

import orjson
import pytest

from tests.conftest import Emulators, StartGateway
from tests.proxy.cache_helpers import CHAT_PATH, TEXT_PATH, ask, chat, completion, events, streamed_text
from tests.proxy.conftest import EMU_FLAGS, Stack, StackFactory
from tests.redis_server import RedisServer

KEY = re.compile(r"kvroute:[0-9a-f]{16}:resp:[0-9a-f]{64}")
LOGGER = "kvroute.response_cache"


def _keys(server: RedisServer) -> dict[str, bytes]:
    with server.client() as c:
        return {k.decode(): c.get(k) or b"" for k in c.scan_iter(match="*", count=1000)}


async def test_gateways_share_answers_through_redis(
    emulator_server: Emulators, gateway: StartGateway, redis_server: RedisServer
) -> None:
    emu = await emulator_server(*EMU_FLAGS)
    one, two = [
        await gateway([emu.url], response_cache=redis_server.url, health_interval=0.1) for _ in range(2)
    ]
    body = chat("which gateway answered")
    _, first, h1 = await ask(one.url, CHAT_PATH, body)
    _, again, h2 = await ask(two.url, CHAT_PATH, body)
    _, replay, h3 = await ask(two.url, CHAT_PATH, body | {"stream": True})
    assert [h["x-kvroute-cache"] for h in (h1, h2, h3)] == ["miss", "hit", "hit"]
    assert orjson.loads(again)["choices"] == orjson.loads(first)["choices"]
    assert streamed_text(events(replay)) == orjson.loads(first)["choices"][0]["message"]["content"]
    assert len(await emu.generations()) == 1


async def test_the_ttl_is_redis_expiry(stack_factory: StackFactory, redis_server: RedisServer) -> None:
    stack = await stack_factory(n=1, response_cache=redis_server.url, response_cache_ttl=0.5)
    await ask(stack.url, CHAT_PATH, chat("expires in redis"))
    (key,) = _keys(redis_server)
    with redis_server.client() as c:
        assert 0 < c.pttl(key) <= 500
    assert (await ask(stack.url, CHAT_PATH, chat("expires in redis")))[2]["x-kvroute-cache"] == "hit"
    await asyncio.sleep(0.6)
    assert _keys(redis_server) == {}
    assert (await ask(stack.url, CHAT_PATH, chat("expires in redis")))[2]["x-kvroute-cache"] == "miss"


async def test_no_key_or_value_holds_prompt_text(
    stack_factory: StackFactory, redis_server: RedisServer
) -> None:
    stack = await stack_factory(n=1, response_cache=redis_server.url)
    marker, salt = "zebra-quartz-marker", "salt-of-tenant-42"
    system = {"role": "system", "content": f"{marker} instructions"}
    bodies = [
        (CHAT_PATH, chat(f"{marker} question") | {"messages": [system, {"role": "user", "content": marker}]}),
        (CHAT_PATH, chat(f"{marker} streamed", stream=True, cache_salt=salt)),
        (TEXT_PATH, completion(f"{marker} completion")),
    ]
    for path, body in bodies:
        assert (await ask(stack.url, path, body))[2]["x-kvroute-cache"] == "miss"
    echoed = completion(f"{marker} echoed", echo=True)  # its answer would repeat the prompt
    assert (await ask(stack.url, TEXT_PATH, echoed))[2]["x-kvroute-cache"] == "bypass"
    stored = _keys(redis_server)
    assert len(stored) == 3 and all(KEY.fullmatch(k) for k in stored)
    for key, value in stored.items():
        assert marker not in key and salt not in key
        assert marker.encode() not in value and salt.encode() not in value
    assert len({k.split(":")[1] for k in stored}) == 2  # the salted tenant has its own namespace


async def test_redis_down_mid_run_fails_no_request(
    stack_factory: StackFactory, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await stack_factory(n=1, response_cache=redis_server.url)
    body = chat("survives redis")
    assert [(await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"] for _ in range(2)] == [
        "miss",
        "hit",
    ]
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert "kvroute_response_cache_stores_total 1.0" in stack.metrics()
    redis_server.stop()
    for i in range(12):  # hits that would have been, new questions, streams: all answered by the replica
        req = body if i % 3 == 0 else chat(f"while down {i}", stream=i % 2 == 1)
        status, _, headers = await ask(stack.url, CHAT_PATH, req)
        assert (status, headers["x-kvroute-cache"]) == (200, "miss")
    assert "kvroute_response_cache_stores_total 1.0" in stack.metrics()  # nothing was written
    down = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(down) == 1 and redis_server.url.split("//")[1].split("/")[0] in down[0].getMessage()
    redis_server.start()  # back, empty, on the same port
    got = []
    for _ in range(40):  # the breaker probes Redis again within a second
        got.append((await ask(stack.url, CHAT_PATH, body))[2]["x-kvroute-cache"])
        if got[-1] == "hit":
            break
        await asyncio.sleep(0.1)
    assert got[-1] == "hit"
    assert sum("answers again" in r.getMessage() for r in caplog.records) == 1


async def test_an_unreachable_redis_is_a_miss(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    nowhere = RedisServer()  # a free port nobody listens on
    stack: Stack = await stack_factory(n=1, response_cache=nowhere.url)
    for _ in range(3):
        status, _, headers = await ask(stack.url, CHAT_PATH, chat("no redis at all"))
        assert (status, headers["x-kvroute-cache"]) == (200, "miss")
    assert sum("unavailable" in r.getMessage() for r in caplog.records) == 1
