"""Rate limits per deployment (issue 40 item 4): buckets shared through a store, spent from local leases.

The rule of the shared bucket, limiters sharing one bucket store, then three gateway apps on one real
``redis-server``: a tenant limited to N requests a minute gets at most N (+1) through all of them, the
rest 429 in OpenAI's shape with Retry-After; and with that Redis stopped, ``--limits-when-store-down``
open (each gateway's own buckets) or closed (503). The same bound through two ``--workers`` processes
without Redis is in tests/proxy/runtime/test_workers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.errors import LimitsUnavailable, RateLimited
from proxy.sync.local_store import LocalStore
from proxy.sync.redis_buckets import RedisBuckets
from proxy.tenancy.keys import ApiKey
from proxy.tenancy.rate_limit import Bucket
from proxy.tenancy.shared_limits import MemoryBuckets, SharedLimiter, take_from
from tests.conftest import Emulators, Gw, StartGateway
from tests.proxy.conftest import EMU_FLAGS, MODEL
from tests.redis_server import RedisServer

LIMIT = 6
KEY = "sk-limited"
KEYS = orjson.dumps([{"key": KEY, "tenant": "tiny", "requests_per_minute": LIMIT}]).decode()
TENANT = ApiKey("0" * 64, "tiny", requests_per_minute=LIMIT, tokens_per_minute=600)


def test_a_take_grants_from_need_up_to_want_or_says_how_long_to_wait() -> None:
    b = Bucket(60, 10.0, 0.0)
    assert take_from(b, 4, 6) == (6.0, 0.0) and b.level == 4.0  # a batch: more than needed
    assert take_from(b, 3, 8) == (4.0, 0.0) and b.level == 0.0  # what is left
    assert take_from(b, 2, 2) == (0.0, 2.0) and b.level == 0.0  # 2 more take 2 s at 1 a second
    full = Bucket(60, 60.0, 0.0)
    assert take_from(full, 100, 100) == (100.0, 0.0) and full.level == -40.0  # passes alone, from full


async def test_limiters_sharing_buckets_admit_the_limit_once_between_them() -> None:
    buckets = MemoryBuckets()
    limiters = [SharedLimiter(buckets) for _ in range(3)]
    admitted = 0
    for i in range(30):
        try:
            await limiters[i % 3].charge(TENANT, 10)
            admitted += 1
        except RateLimited as e:
            assert e.retry_after is not None and e.retry_after >= 1
    assert LIMIT <= admitted <= LIMIT + 1


async def test_a_request_refused_for_its_tokens_keeps_its_request() -> None:
    buckets = MemoryBuckets()
    limiter = SharedLimiter(buckets)
    await limiter.charge(TENANT, 590)
    with pytest.raises(RateLimited, match="tokens"):
        await limiter.charge(TENANT, 100)  # 10 tokens left
    limiter.settle(TENANT, 590, 90)  # it used 90: 500 come back to its lease
    for _ in range(LIMIT - 1):  # the refused one took no request
        await limiter.charge(TENANT, 50)
    with pytest.raises(RateLimited, match="requests"):
        await limiter.charge(TENANT, 1)


async def test_an_unspent_lease_goes_back_to_the_bucket() -> None:
    buckets = MemoryBuckets()
    big = ApiKey("1" * 64, "big", requests_per_minute=6000)  # leases 50 beyond what a request needs
    a, b = SharedLimiter(buckets), SharedLimiter(buckets)
    await a.charge(big, 0)
    assert buckets._bucket(_bucket_of(a), 6000).level < 6000 - 50  # a holds a lease
    assert await a.sweep(all_=True) == 1
    assert 5999 <= buckets._bucket(_bucket_of(a), 6000).level <= 6000  # back, but the one request spent
    assert await a.sweep(all_=True) == 0
    await b.charge(big, 0)


def _bucket_of(limiter: SharedLimiter) -> str:
    (lease,) = limiter._leases.values()
    return lease.bucket


async def test_a_store_that_is_not_there_falls_back_open_or_closed(tmp_path: Path) -> None:
    gone = "kvroute+unix://" + str(tmp_path / "no-hub.sock")
    open_ = SharedLimiter(LocalStore(gone), "open")
    for _ in range(LIMIT):
        await open_.charge(TENANT, 1)  # this process's own buckets
    with pytest.raises(RateLimited):
        await open_.charge(TENANT, 1)
    assert open_.status()["state"] == "down" and open_.fallbacks == LIMIT + 1
    closed = SharedLimiter(LocalStore(gone), "closed")
    with pytest.raises(LimitsUnavailable) as refused:
        await closed.charge(TENANT, 1)
    assert refused.value.status == 503 and refused.value.retry_after == 1
    await closed.charge(ApiKey("2" * 64), 1)  # an unlimited key never asks the store


async def test_tokens_per_minute_are_shared_through_redis(redis_server: RedisServer) -> None:
    stores = [RedisBuckets(redis_server.url, "t") for _ in range(2)]
    limiters = [SharedLimiter(s, timeout_s=2.0) for s in stores]
    key = ApiKey("3" * 64, "toks", tokens_per_minute=1000)
    spent = 0
    for i in range(20):
        try:
            await limiters[i % 2].charge(key, 100)
            spent += 100
        except RateLimited:
            pass
    # never more than the minute's 1000 (the refill meanwhile is < 100); less by at most what the two
    # leases hold unspent (8 tokens beyond a request each) and the bucket's remainder below a request
    assert 800 <= spent <= 1000
    client = redis_server.client()
    keys = [str(k, "utf-8") for k in client.scan_iter("*")]
    assert keys and all(k.startswith("kvroute:{t}:limit:") and "toks" not in k for k in keys)
    assert all(0 < client.pttl(k) <= 61_000 for k in keys)
    for s in stores:
        await s.close()


async def _gateways(emulators: Emulators, start: StartGateway, n: int, **settings: Any) -> list[Gw]:
    url = (await emulators(*EMU_FLAGS)).url
    defaults = {"health_interval": 0.1, "api_keys": KEYS}
    return [await start([url], **(defaults | settings)) for _ in range(n)]


async def _ask(s: aiohttp.ClientSession, gw: Gw, i: int) -> tuple[int, dict[str, Any], str | None]:
    body = {"model": MODEL, "prompt": f"question {i}", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with s.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers.get("Retry-After")


async def test_three_gateways_on_one_redis_admit_n_requests_a_minute_between_them(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway
) -> None:
    gws = await _gateways(emulator_server, gateway, 3, state=redis_server.url)
    async with aiohttp.ClientSession() as s:
        answers = [await _ask(s, gws[i % 3], i) for i in range(30)]
    ok = [a for a in answers if a[0] == 200]
    assert LIMIT <= len(ok) <= LIMIT + 1
    refused = [a for a in answers if a[0] != 200]
    for status, doc, retry_after in refused:
        assert status == 429 and retry_after is not None and int(retry_after) >= 1
        assert doc["error"] | {"message": ""} == {
            "message": "",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }


@pytest.mark.parametrize("when_down", ["open", "closed"])
async def test_with_redis_stopped_limits_fail_open_or_closed(
    redis_server: RedisServer, emulator_server: Emulators, gateway: StartGateway, when_down: str
) -> None:
    gws = await _gateways(
        emulator_server, gateway, 2, state=redis_server.url, limits_when_store_down=when_down
    )
    redis_server.stop()
    async with aiohttp.ClientSession() as s:
        answers = [await _ask(s, gws[i % 2], i) for i in range(4 * LIMIT)]
    statuses = [a[0] for a in answers]
    if when_down == "open":  # each gateway its own limit of N
        assert statuses.count(200) == 2 * LIMIT and set(statuses) == {200, 429}
    else:
        assert set(statuses) == {503}
        for _, doc, retry_after in answers:
            assert doc["error"]["code"] == "rate_limits_unavailable" and retry_after == "1"
    limiters = [g.gw.limiter for g in gws]
    assert all(isinstance(x, SharedLimiter) and x.status()["state"] == "down" for x in limiters)
