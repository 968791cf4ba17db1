"""How far the gateway's view of a replica can be trusted (proxy/sync/knowledge.py): the rules on their
own (no I/O, no clock), then the failure modes of the review with real emulated replicas, each shown
on /status within 10 s and said in the log once, not once a second."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
import zmq

from proxy.fleet.replica import Replica
from proxy.observe.history import Outcome
from proxy.observe.said import Said
from proxy.sync.knowledge import ERROR_BOUND, NO_BATCH_S, TOKENS_BOUND, judge, window
from proxy.sync.kv_link import Link
from routing.exact import KvMode
from tests.conftest import Emulators, Gw, StartGateway, wait_for
from tests.proxy.sync.test_kv_subscriber import free_port

ROOT = Path(__file__).resolve().parents[3]
BPE, PSEUDO = str(ROOT / "emulator" / "model_bpe"), str(ROOT / "emulator" / "model")
EXACT, LEARNED = KvMode("exact"), KvMode("learned", "no KV events")


class Feeds:
    def __init__(
        self, endpoint: str | None = "tcp://r:1", error: str | None = None, live: tuple[int, float] = (0, 0.0)
    ) -> None:
        self.endpoint, self.error, self.live = endpoint, error, live

    def subscribed(self, replica: str) -> str | None:
        return self.endpoint

    def subscribe_error(self, replica: str) -> str | None:
        return self.error

    def batches(self, replica: str) -> tuple[int, float]:
        return self.live


def healthy() -> Replica:
    r = Replica("http://r")
    r.healthy = True
    return r


def outcome(
    at: float, prompt: int = 1000, cached: int = 500, predicted: float = 500.0, counted: int | None = 1000
) -> Outcome:
    return Outcome(at, "chat", "http://r", "prefix_gpu", True, 0.1, predicted, 0.1, prompt, cached, counted)


def test_a_working_exact_replica_and_a_learned_one() -> None:
    now = time.time()
    done = [outcome(now - 1) for _ in range(6)]
    assert judge(healthy(), EXACT, Feeds(live=(6, now)), done, True).state == "exact"
    k = judge(healthy(), LEARNED, Feeds(endpoint=None), done, False)
    assert (k.state, k.reason) == ("learned", "no KV events")


def test_the_degraded_rules_in_order() -> None:
    now = time.time()
    down = healthy()
    down.healthy, down.last_error = False, "connection refused"
    assert judge(down, EXACT, Feeds(), [], True).reason == "out of the pool (connection refused)"
    assert "cannot subscribe" in judge(healthy(), EXACT, Feeds(error="bind x: in use"), [], True).reason
    quiet = [outcome(now - NO_BATCH_S - 1) for _ in range(3)]
    assert "no KV event batch after 3 requests" in judge(healthy(), LEARNED, Feeds(), quiet, True).reason
    stopped = [outcome(now - 2) for _ in range(3)]
    gone = judge(healthy(), EXACT, Feeds(live=(9, now - NO_BATCH_S - 5)), stopped, True)
    assert "stopped" in gone.reason
    off = [outcome(now - 1, counted=round(1000 * (1 - 2 * TOKENS_BOUND))) for _ in range(5)]
    assert "tokenizer mismatch" in judge(healthy(), EXACT, Feeds(live=(5, now)), off, True).reason
    assert judge(healthy(), EXACT, Feeds(live=(5, now)), off, False).state == "exact"  # estimates: no check
    wrong = [outcome(now - 1, predicted=500 + 2 * ERROR_BOUND * 1000) for _ in range(5)]
    assert "cache model error 10.0%" in judge(healthy(), EXACT, Feeds(live=(5, now)), wrong, True).reason
    few = wrong[:4]  # below MIN_SAMPLES: not judged yet
    assert judge(healthy(), EXACT, Feeds(live=(5, now)), few, True).state == "exact"


def test_the_window_ratios() -> None:
    w = window([outcome(0, 1000, 400, 500, 990), outcome(0, 1000, 600, 500, 1010), outcome(0, 0, 0, 9)])
    assert (w.requests, w.error_ratio, w.tokens_ratio) == (2, 0.1, 0.01)


def test_said_once_then_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    said = Said(logging.getLogger("t"), every_s=60.0)
    for t in range(0, 120, 1):
        said.warn("k", "trouble", now=float(t))
    said.clear("k")
    said.warn("k", "trouble again", now=121.0)
    logged = [r.getMessage() for r in caplog.records if r.name == "t"]
    assert logged == ["trouble", "trouble (59 more since the last time)", "trouble again"]


def test_the_link_follows_its_monitor() -> None:
    reconnects: list[int] = []
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    link = Link(sock, lambda: reconnects.append(1))  # type: ignore[arg-type]
    try:
        for event in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CONNECT_RETRIED):
            link.note(event)
        assert (link.state, link.retries) == ("connecting", 2)
        link.note(zmq.EVENT_CONNECTED)
        link.note(zmq.EVENT_DISCONNECTED)
        assert reconnects == [] and link.state == "dropped"
        link.note(zmq.EVENT_ACCEPTED)
        assert reconnects == [1] and link.state == "connected" and link.reconnects == 1
    finally:
        link.close()
        sock.close(linger=0)
        ctx.destroy(linger=0)


# ---- real replicas -----------------------------------------------------------------------------------
async def _replica(emulator_server: Emulators, endpoint: str, *more: str) -> str:
    events = json.dumps({"publisher": "zmq", "endpoint": endpoint})
    flags = (
        "--emu-time-scale",
        "0.01",
        "--page-size",
        "16",
        "--enable-cache-report",
        "--served-model-name",
        "m",
    )
    emu = await emulator_server(
        *flags, "--kv-events-config", events, "--emu-kv-events-format", "0.5.23", *more
    )
    return emu.url


def knowledge(gw: Gw, rid: str) -> dict[str, str]:
    return dict(gw.gw.metrics.sections()["knowledge"][rid])


async def _chats(gw: Gw, n: int) -> None:
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"question {i} " * 40}],
                "max_tokens": 2,
            }
            async with s.post(
                gw.url + "/v1/chat/completions",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 200


async def test_a_second_gateway_that_cannot_bind_says_so_once(
    emulator_server: Emulators, gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica's PUB connects (a host endpoint): each gateway's SUB must bind that address, and only
    one can. The second shows it on /status and says it once, however many times it retries."""
    caplog.set_level(logging.WARNING)
    url = await _replica(emulator_server, f"tcp://127.0.0.1:{free_port()}")
    first = await gateway([url], kv_events="on")
    second = await gateway([url], kv_events="on")
    await wait_for(lambda: knowledge(second, url)["state"] == "degraded", 10.0)
    assert (
        "cannot subscribe" in knowledge(second, url)["reason"]
        and knowledge(first, url)["state"] != "degraded"
    )
    status = second.gw.metrics.sections()
    assert any("cannot subscribe" in w for w in _warnings(second))
    said = [r for r in caplog.records if "cannot subscribe" in r.getMessage()]
    assert (
        len(said) == 1
        and f'kvroute_replica_knowledge{{replica="{url}",state="degraded"}} 1.0' in second.metrics()
    )
    assert status["kv_events"][url]["why"].startswith("cannot subscribe")


def _warnings(gw: Gw) -> list[str]:
    from proxy.status.document import status_document

    return list(status_document(gw.gw)["warnings"])


async def test_a_wrong_tokenizer_is_degraded_not_exact(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    """The replicas tokenize with the BPE tokenizer, the gateway with the pseudo one: the counts differ."""
    url = await _replica(
        emulator_server, "tcp://*:" + str(free_port()), "--model-path", BPE, "--emu-tokenizer", "hf"
    )
    gw = await gateway([url], tokenizer_path=PSEUDO)
    await _chats(gw, 6)
    await wait_for(lambda: knowledge(gw, url)["state"] == "degraded", 10.0)
    assert "tokenizer mismatch" in knowledge(gw, url)["reason"]


async def test_a_replica_down_is_degraded(emulator_server: Emulators, gateway: StartGateway) -> None:
    emu = await emulator_server("--emu-time-scale", "0.01", "--served-model-name", "m", "--emu-enable-faults")
    gw = await gateway([emu.url], health_interval=0.1)
    assert knowledge(gw, emu.url)["state"] == "learned"
    await emu.fault(action="unhealthy")
    await wait_for(lambda: knowledge(gw, emu.url)["state"] == "degraded", 10.0)
    assert knowledge(gw, emu.url)["reason"].startswith("out of the pool")
