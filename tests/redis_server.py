"""A real ``redis-server`` for tests: ``bench.systems.redis_proc.RedisServer`` (its own process on a free
127.0.0.1 port, no persistence, stopped by its PID; ``stop()`` and ``start()`` again bring it back empty
on the same port, a Redis restart), skipping the test where ``redis-server`` is not installed."""

from __future__ import annotations

from typing import Self

import pytest

from bench.systems import redis_proc


class RedisServer(redis_proc.RedisServer):
    def start(self) -> Self:
        try:
            return super().start()
        except redis_proc.RedisNotInstalled:
            pytest.skip("redis-server is not installed")
