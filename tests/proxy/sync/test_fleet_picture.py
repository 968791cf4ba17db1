"""The gateway's picture of a replica after restarts, with real processes: an emulated replica (a
``python -m emulator`` process, HiCache write_back, SGLang 0.5.23 KV events, the BPE tokenizer) killed
and started again on the same ports, and gateways in exact mode (``--tokenizer-path``). The gateway's
tokens per tier must equal the replica's own (``/_emu/state``) within 1%, and stay so when the slower
detector (the start time, read later) catches up; a gateway started after the replica cached its
documents sees them at once (the catch-up replay)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import free_ports
from tests.conftest import Gw, StartGateway, wait_for

ROOT = Path(__file__).resolve().parents[3]
BPE = str(ROOT / "emulator" / "model_bpe")
MODEL = "emu-bpe"
VIEW_WAIT_S = 5.0  # the bound: within 5 s of a restart (or a start) the view is right again


def _flags(kv_port: int, replay_port: int) -> list[str]:
    events = {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{kv_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    return [
        "--served-model-name", MODEL, "--model-path", BPE, "--emu-tokenizer", "hf",
        "--kv-events-config", json.dumps(events), "--emu-kv-events-format", "0.5.23",
        "--enable-hierarchical-cache", "--hicache-write-policy", "write_back", "--page-size", "16",
        "--max-total-tokens", "3000", "--enable-cache-report", "--emu-debug", "--emu-time-scale", "0.01",
    ]  # fmt: skip


class Replica:
    """One emulator process that can be killed and started again on the same ports."""

    def __init__(self, tmp: Path) -> None:
        self.port, kv, replay = free_ports(3)
        self.flags, self.tmp, self.starts = _flags(kv, replay), tmp, 0
        self.proc: EmulatorFleet | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        log = self.tmp / f"emulator-{self.starts}.log"
        self.proc = EmulatorFleet(1, self.flags, log, ports=[self.port]).start()

    def kill(self) -> None:
        assert self.proc is not None and self.proc.pid is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.close()

    async def tiers(self) -> tuple[float, float]:
        async with aiohttp.ClientSession() as s, s.get(self.url + "/_emu/state") as r:
            cache = (await r.json())["cache"]
            return float(cache["gpu_cached"]), float(cache["host_used"])


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Replica]:
    r = Replica(tmp_path)
    r.start()
    try:
        yield r
    finally:
        if r.proc is not None:
            r.proc.close()


def view(gw: Gw, rid: str) -> tuple[float, float]:
    r = gw.gw.router.status().replicas.get(rid)
    return (r.gpu.tokens, r.host.tokens) if r is not None else (0.0, 0.0)


async def agrees(gw: Gw, emu: Replica) -> bool:
    """The gateway's GPU and host tokens equal the replica's within 1% (and one page)."""
    mine, theirs = view(gw, emu.url), await emu.tiers()
    return all(abs(a - b) <= max(16.0, 0.01 * b) for a, b in zip(mine, theirs, strict=True)) and theirs[0] > 0


async def chat(gw: Gw, doc: int, question: str) -> dict[str, Any]:
    text = f"Document {doc}. " + " ".join(f"fact{doc}x{i} is {i * 7}." for i in range(90))
    messages = [{"role": "system", "content": text}, {"role": "user", "content": question}]
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 2})
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/chat/completions", data=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        return dict(await r.json())


@contextmanager
def no_wipe(gw: Gw) -> Iterator[list[str]]:
    """The resets the router is asked for while inside (a wipe of a rebuilt view would show here)."""
    calls: list[str] = []
    restart = gw.gw.router.restart
    gw.gw.fleet.restarts._restart = lambda rid: (calls.append(rid), restart(rid))[1]
    yield calls


@pytest.mark.parametrize("down_s", [0.0, 3.0])
async def test_a_restart_is_rebuilt_from_events_and_never_wiped_after(
    emu: Replica, gateway: StartGateway, down_s: float
) -> None:
    """Killed and started again (at once, or after a down time that fails health checks): the feed sees
    the sequence start over, resets once and replays the new publisher; the start-time check that
    follows leaves the rebuilt view alone."""
    gw = await gateway([emu.url], tokenizer_path=BPE, health_interval=0.5)
    for d in range(5):  # a GPU pool of 3000 tokens: the first documents go to the host pool
        await chat(gw, d, "What is fact 3?")
    await wait_for(lambda: agrees(gw, emu), VIEW_WAIT_S)
    emu.kill()
    if down_s:
        await wait_for(lambda: not gw.gw.fleet.get(emu.url).healthy, 10.0)  # type: ignore[union-attr]
    emu.start()
    await wait_for(lambda: gw.gw.fleet.get(emu.url).healthy, 5.0)  # type: ignore[union-attr]
    for d in (5, 6):
        await chat(gw, d, "And fact 4?")
    await wait_for(lambda: agrees(gw, emu), VIEW_WAIT_S)
    with no_wipe(gw) as wipes:
        replica = gw.gw.fleet.get(emu.url)
        assert replica is not None
        await gw.gw.fleet.check(gw.gw.up, replica, refresh=True)  # the start time catches up
        assert wipes == [] and gw.gw.fleet.restarts.counts["restarts"] == 1  # one restart, seen once
    assert await agrees(gw, emu)
    assert (await chat(gw, 5, "And fact 5?"))["usage"]["prompt_tokens_details"]["cached_tokens"] > 500


async def test_a_gateway_that_starts_late_sees_what_the_replica_holds(
    emu: Replica, gateway: StartGateway
) -> None:
    first = await gateway([emu.url], tokenizer_path=BPE)
    for d in range(3):
        await chat(first, d, "What is fact 1?")
    await wait_for(lambda: agrees(first, emu), VIEW_WAIT_S)
    late = await gateway([emu.url], tokenizer_path=BPE)  # no request through it yet
    await wait_for(lambda: agrees(late, emu), VIEW_WAIT_S)
    status = late.gw.metrics.sections()["kv_events"][emu.url]
    assert status["replayed_batches"] > 0 and status["resets"] == 0
