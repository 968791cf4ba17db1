"""The fault-injection suite: each of the ten fault kinds of ``bench.labs.fault_lab`` (replica killed, hung,
dropping some requests while it serves the rest, answering 500/503, stream cut, slow, connection reset,
restarted with its cache lost, Redis down, Redis flushed) on an emulated fleet of real processes, through
a fresh gateway, with a bounded burst of streamed and non-streamed requests. Targets: 0 lost requests, 0
failures for requests not yet streaming; a stream already started may only end with one clean SSE error
event."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.labs.fault_lab import KINDS, FaultLab, run_kind
from bench.systems import redis_proc

REQUESTS = 24
HITS_THE_GATEWAY = {"killed", "hung", "dropped", "fail", "cut_stream", "reset"}  # kinds the gateway must meet
MAY_CUT_STREAMS = {"killed", "cut_stream", "restart"}


@pytest.fixture(scope="module")
def lab() -> Iterator[FaultLab]:
    try:
        redis_proc.executable()
    except redis_proc.RedisNotInstalled:
        pytest.skip("redis-server is not installed")
    with FaultLab() as lab:
        yield lab


@pytest.mark.parametrize("kind", KINDS)
async def test_no_request_is_lost_and_none_fails_before_streaming(lab: FaultLab, kind: str) -> None:
    t = await run_kind(lab, kind, REQUESTS, concurrency=6)
    assert t.requests == REQUESTS
    assert (t.lost, t.failed_early) == (0, 0), t
    assert t.completed + t.stream_errors == REQUESTS
    if kind not in MAY_CUT_STREAMS:
        assert t.stream_errors == 0, t
    if kind in HITS_THE_GATEWAY:  # the fault happened, and was absorbed by retries
        assert t.upstream_errors >= 1 and t.retries >= 1, t
