"""The ports of `kvroute emulate --replicas N` (emulator/port_plan.py): every replica's KV-event publisher
and replay endpoints are distinct and bound, and a layout that would reuse a port is refused by name.

The process test plays the gateway's part: it binds one SUB socket on each replica's publisher port (the
publishers connect, as SGLang's do to a non-wildcard endpoint) before the emulator starts; with the old
layout (both ports + i) replica 1's publisher port was replica 0's replay port, and one of the two binds
failed with "Address already in use".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from bench.systems.fleet import free_port_run
from bench.systems.procs import ManagedProcess
from emulator.config import parse_args
from proxy.sync.kv_wire import decode_message, decode_replay, replay_request

WAIT_S = 5.0
LOOP = "127.0.0.1"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return bytes(resp.read())


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def _replay_answers(ctx: zmq.asyncio.Context, endpoint: str) -> bool:
    """True when the ROUTER bound at `endpoint` answers a replay request with its end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    async with asyncio.timeout(WAIT_S):
        await dealer.send_multipart([b"", replay_request(0)])
        while decode_replay(await dealer.recv_multipart()) is not None:
            pass
    dealer.close(linger=0)
    return True


async def _hears(sub: zmq.asyncio.Socket, url: str) -> bool:
    """True once `sub` receives a batch of the replica at `url`: it flushes its cache (an AllBlocksCleared
    batch at once) until one arrives, since a batch published before the connection is up is lost."""
    for _ in range(20):
        await asyncio.to_thread(_post, f"{url}/flush_cache", {})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                return bool(decode_message(await sub.recv_multipart()).events)
    return False


async def test_three_replicas_publish_and_replay_on_six_distinct_bound_ports(
    ctx: zmq.asyncio.Context,
) -> None:
    kv, http = free_port_run(6), free_port_run(3)
    subs = []
    for i in range(3):  # the gateway binds where each replica's publisher connects
        sub = ctx.socket(zmq.SUB)
        sub.subscribe(b"")
        sub.bind(f"tcp://{LOOP}:{kv + 2 * i}")
        subs.append(sub)
    config = {
        "publisher": "zmq",
        "endpoint": f"tcp://{LOOP}:{kv}",
        "replay_endpoint": f"tcp://{LOOP}:{kv + 1}",
    }
    argv = [sys.executable, "-m", "emulator", "--host", LOOP, "--port", str(http), "--replicas", "3"]
    argv += ["--emu-time-scale", "0.01", "--kv-events-config", json.dumps(config)]
    urls = [f"http://{LOOP}:{http + i}" for i in range(3)]
    with ManagedProcess(argv, urls):
        reported = [json.loads(_get(f"{url}/server_info")["kv_events_config"]) for url in urls]
        publishers = [doc["endpoint"] for doc in reported]
        replays = [doc["replay_endpoint"] for doc in reported]
        assert publishers == [f"tcp://{LOOP}:{kv + 2 * i}" for i in range(3)]
        assert replays == [f"tcp://{LOOP}:{kv + 2 * i + 1}" for i in range(3)]
        assert len(set(publishers + replays)) == 6
        for endpoint in replays:
            assert await _replay_answers(ctx, endpoint)
        for sub, url in zip(subs, urls, strict=True):  # each replica's events reach the SUB on its port
            assert await _hears(sub, url)
    for sub in subs:
        sub.close(linger=0)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            [
                "--kv-events-config",
                '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5557"}',
            ],
            "port 5557 would be both replica 0's KV-event publisher endpoint and replica 0's KV-event replay",
        ),
        (
            [
                "--port",
                "30000",
                "--replicas",
                "3",
                "--kv-events-config",
                '{"publisher":"zmq","endpoint":"tcp://*:29999"}',
            ],
            "port 30000 would be both replica 0's HTTP port and replica 1's KV-event publisher endpoint",
        ),
        (
            ["--port", "8997", "--replicas", "2", "--disaggregation-mode", "prefill"],
            "port 8998 would be both replica 0's PD bootstrap port and replica 1's HTTP port",
        ),
    ],
)
def test_a_layout_that_reuses_a_port_is_refused(flags: list[str], named: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(flags)
    assert named in str(exc.value)


def test_stride_one_unless_publisher_and_replay_ports_meet() -> None:
    far = {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600"}
    near = {**far, "replay_endpoint": "tcp://*:5556"}
    assert parse_args(["--replicas", "3", "--kv-events-config", json.dumps(far)]).kv_port_stride == 1
    cfg = parse_args(["--replicas", "3", "--kv-events-config", json.dumps(near)])
    ports = [cfg.with_port(p).replica_kv_events for p in cfg.ports]
    assert cfg.kv_port_stride == 2
    assert [(e.endpoint, e.replay_endpoint) for e in ports if e is not None] == [
        ("tcp://*:5557", "tcp://*:5556"),
        ("tcp://*:5559", "tcp://*:5558"),
        ("tcp://*:5561", "tcp://*:5560"),
    ]
    mixed = parse_args(["--ports", "9100,9101,9102", "--disaggregation-mode", "prefill,decode,prefill"])
    replicas = [mixed.with_port(p) for p in mixed.ports]
    assert [(r.pd.mode, r.bootstrap_port) for r in replicas] == [
        ("prefill", 8998),
        ("decode", 8999),
        ("prefill", 9000),
    ]
    with pytest.raises(SystemExit, match="lists 2 modes for 3 replicas"):
        parse_args(["--replicas", "3", "--disaggregation-mode", "prefill,decode"])
    prefill = parse_args(
        ["--replicas", "2", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "9000"]
    )
    assert [prefill.with_port(p).bootstrap_port for p in prefill.ports] == [9000, 9001]
