"""``proxy.sync.redis_store.connect``: each URL scheme gives the client it names, built without connecting."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from proxy.sync.redis_store import TIMEOUT_S, connect


async def test_a_sentinel_url_names_the_service_the_db_and_every_sentinel() -> None:
    client = connect("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/2")
    pool = client.connection_pool
    assert isinstance(client, aioredis.Redis) and isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster" and pool.connection_kwargs["db"] == 2
    hosts = [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"])
             for c in pool.sentinel_manager.sentinels]  # fmt: skip
    assert hosts == [("127.0.0.1", 26379), ("127.0.0.1", 26380)]
    assert pool.connection_kwargs["socket_timeout"] == TIMEOUT_S


def test_a_sentinel_url_without_a_service_is_refused() -> None:
    with pytest.raises(ValueError, match="service name"):
        connect("redis+sentinel://127.0.0.1:26379")


async def test_plain_and_cluster_urls() -> None:
    plain = connect("redis://127.0.0.1:6390/3")
    assert isinstance(plain, aioredis.Redis) and plain.connection_pool.connection_kwargs["db"] == 3
    assert isinstance(connect("redis+cluster://127.0.0.1:7000"), RedisCluster)
