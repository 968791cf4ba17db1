"""GET /status: JSON for programs, the page for browsers, and what the JSON document adds per replica."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.observe.history import History, Outcome
from proxy.status.page import CSP
from tests.proxy.conftest import ADMIN, Stack
from tests.proxy.observe.test_metrics import chat

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"


async def get(stack: Stack, path: str, accept: str | None) -> tuple[int, str, bytes, dict[str, str]]:
    headers = ({"Accept": accept} if accept is not None else {}) | ADMIN  # the stack has an admin key
    async with aiohttp.ClientSession(headers=headers) as s, s.get(stack.url + path) as r:
        return r.status, r.content_type, await r.read(), dict(r.headers)


@pytest.mark.parametrize(
    "accept",
    [None, "*/*", "application/json", "application/json, text/html;q=0.5", "text/html;q=0", "text/plain"],
)
async def test_programs_get_json(stack: Stack, accept: str | None) -> None:
    status, kind, body, _ = await get(stack, "/status", accept)
    assert status == 200 and kind == "application/json" and orjson.loads(body)["policy"] == "round_robin"


@pytest.mark.parametrize("accept", [BROWSER, "text/html", "text/html, application/json;q=0.9"])
async def test_browsers_get_the_page(stack: Stack, accept: str) -> None:
    status, kind, body, headers = await get(stack, "/status", accept)
    assert status == 200 and kind == "text/html" and b"<title>kvroute status</title>" in body
    assert headers["Content-Security-Policy"] == CSP and "connect-src 'self'" in CSP
    # self-contained: no script, style sheet, image or font from anywhere
    assert not re.search(rb"""(src|href)\s*=|@import|url\(""", body)
    assert set(re.findall(rb"https?://[^\s\"'`]+", body)) == {b"http://www.w3.org/2000/svg"}


async def test_format_overrides_accept(stack: Stack) -> None:
    assert (await get(stack, "/status?format=html", "application/json"))[1] == "text/html"
    assert (await get(stack, "/status?format=json", BROWSER))[1] == "application/json"
    status, _, body, _ = await get(stack, "/status?format=xml", BROWSER)
    error = orjson.loads(body)["error"]
    assert status == 400 and error["param"] == "format" and "'html' or 'json'" in error["message"]


async def test_the_json_document_per_replica(stack: Stack) -> None:
    marker = "zebra-marker-7f3a"  # prompt text must never show up in /status
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)  # the replicas' counters before the traffic
    for _ in range(4):
        assert (await chat(stack.url, f"{marker} same prompt", stream=True))[0] == 200
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)
    _, _, raw, _ = await get(stack, "/status", None)
    assert marker.encode() not in raw
    doc: dict[str, Any] = orjson.loads(raw)
    assert doc["scrape_interval_s"] == 0.5  # the tests' 0.1 s health interval, bounded
    for r in doc["replicas"]:
        assert set(r["load"]) == {
            "inflight_requests", "queued_prefill_s", "queued_prefill_tokens", "utilization", "arrival_rate",
            "last_body_byte_s_ago",
        }  # fmt: skip
        assert (
            0.0 <= r["load"]["last_body_byte_s_ago"] < 30.0
        )  # it streamed to us (proxy/upstream/liveness.py)
        gpu = r["cache_model"]["gpu"]
        assert gpu["capacity_tokens"] == 100_000 and gpu["blocks"] > 0
        assert gpu["fill"] == pytest.approx(gpu["tokens"] / 100_000)
        assert r["cache_model"]["storage"]["fill"] is None  # no storage tier: no capacity
        assert r["reported"]["enabled"] is True and r["reported"]["errors"] == 0
        assert 0 < r["reported"]["gauges"]["token_usage"] < 1
        assert len(r["ttft_recent_s"]) == 2 and all(t > 0 for t in r["ttft_recent_s"])
        ratio = r["hit_ratio"]
        assert 0 < ratio["gateway"] < 1 and ratio["device"] == pytest.approx(
            ratio["gateway"]
        )  # no other client
    decisions = doc["decisions"]
    assert len(decisions) == 4 and [d["at"] for d in decisions] == sorted(
        (d["at"] for d in decisions), reverse=True
    )
    assert {d["reason"] for d in decisions} == {"round_robin"} and all(d["ok"] for d in decisions)
    assert decisions[0]["cached_tokens"] > 0 and decisions[-1]["cached_tokens"] == 0
    assert all(d["predicted_ttft_s"] > 0 and d["prompt_tokens"] > 0 for d in decisions)


async def test_sections_other_modules_register(stack: Stack) -> None:
    m = stack.gw.metrics
    m.register_section("warmup", lambda: {"documents": [{"id": "doc-1", "state": "warm"}]})
    m.register_section("replicas", lambda: "must not replace the core document")

    def broken() -> object:
        raise RuntimeError("redis went away")

    m.register_section("state", broken)
    doc = orjson.loads((await get(stack, "/status", None))[2])
    assert doc["warmup"] == {"documents": [{"id": "doc-1", "state": "warm"}]}
    assert isinstance(doc["replicas"], list) and doc["state"] == {"error": "RuntimeError: redis went away"}


def _outcome(replica: str, at: float, prompt: int | None = 100, cached: int | None = 50) -> Outcome:
    return Outcome(at, "chat", replica, "prefix_gpu", True, 0.1, 40.0, 0.05 + at, prompt, cached)


def test_history_rings_are_bounded_and_newest_first() -> None:
    h = History(decisions=3, per_replica=2)
    for i in range(5):
        h.add(_outcome("a" if i % 2 else "b", float(i)))
    assert [o.at for o in h.decisions()] == [4.0, 3.0, 2.0]
    assert h.ttfts("b") == [2.05, 4.05] and h.ttfts("a") == [1.05, 3.05]
    h.add(_outcome("a", 5.0, prompt=300, cached=0))
    h.add(_outcome("a", 6.0, prompt=None, cached=None))  # no usage reported: not in the ratio
    assert h.hit_ratio("a") == 0.0 and h.hit_ratio("nobody") is None
    h.retain(["a"])
    assert h.ttfts("b") == [] and len(h.decisions()) == 3
