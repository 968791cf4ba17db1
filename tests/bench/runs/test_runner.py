"""The runner against a real aiohttp server on port 0 that streams SGLang-shaped SSE events."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from bench.runs.progress import Progress
from bench.runs.replay import replay, rotating
from bench.workloads.generators import CHAT, TimedRequest, Workload

SEEN = web.AppKey("seen", list[dict[str, object]])


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[SEEN].append({"body": body, "session": request.headers.get("x-session-id")})
    if body["messages"][0]["content"] == "fail":
        return web.json_response({"object": "error", "message": "boom", "code": 503}, status=503)
    resp = web.StreamResponse(headers={"x-emu-replica": "127.0.0.1:7777"})
    resp.content_type = "text/event-stream"
    await resp.prepare(request)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None}
    await resp.write(b"data: " + orjson.dumps(role) + b"\n\n")
    await asyncio.sleep(0.05)
    text = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None}
    await resp.write(b"data: " + orjson.dumps(text) + b"\n\n")
    usage = {"prompt_tokens": 100, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 64}}
    await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post(CHAT, chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", app[SEEN]
    await runner.cleanup()


def req(i: int, content: str = "x", after: int | None = None, arrival: float = 0.0) -> TimedRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    return TimedRequest(
        i, arrival, f"s{i}", CHAT, body, 100, "t", after=after, think_s=1.0 if after is not None else 0.0
    )


def _progress(n: int) -> Progress:
    return Progress("test", n, stream=io.StringIO())


async def test_records_ttft_usage_replica_and_errors(server: tuple[str, list[dict[str, object]]]) -> None:
    url, seen = server
    wl = Workload("w", "", (req(0), req(1, "fail"), req(2, after=0)), sessions=True)
    scale = 0.1
    records = await replay(wl, rotating([url]), scale, 10.0, _progress(3))
    ok, failed, child = records
    assert ok.ttft_s is not None and 0.05 / scale * 0.9 <= ok.ttft_s < 0.5 / scale
    assert (ok.prompt_tokens, ok.cached_tokens, ok.replica) == (100, 64, "127.0.0.1:7777")
    assert failed.status == 503 and failed.error.startswith("HTTP 503") and not failed.ok
    assert child.sent_s >= ok.sent_s + (ok.e2e_s or 0) + 1.0 * 0.9
    assert all(s["session"] is not None for s in seen)
    sent = [s["body"] for s in seen]
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in sent)  # type: ignore[index]


async def test_deadline_bounds_the_replay(server: tuple[str, list[dict[str, object]]]) -> None:
    url, seen = server
    wl = Workload("w", "", (req(0), req(1, arrival=100.0)))
    records = await replay(wl, rotating([url]), 0.01, 0.5, _progress(2))
    assert records[0].ok and records[1].error == "deadline"
    assert all(s["session"] is None for s in seen)


async def test_ttft_counts_from_the_scheduled_arrival_when_the_client_delays_a_request(
    server: tuple[str, list[dict[str, object]]],
) -> None:
    """Two requests due at once with a cap of one in flight: the second waits for the first (a client-side
    delay) and its TTFT still starts at its arrival; so does a request the client's own loop made late."""
    url, _ = server
    scale = 0.1
    late = {"x"}

    def choose(r: TimedRequest) -> str:
        if r.index == 2 and late:
            late.clear()
            time.sleep(0.1)  # the client's event loop is busy: this request goes out 0.1 s late
        return url

    wl = Workload("w", "", (req(0), req(1), req(2, arrival=2.0)))
    first, second, third = await replay(wl, choose, scale, 10.0, _progress(3), cap=1)
    assert not first.capped and second.capped and not third.capped
    assert second.wait_s >= (0.05 / scale) * 0.9  # it was sent only once the first one had answered
    assert second.ttft_s == pytest.approx(second.wait_s + (second.send_ttft_s or 0), abs=1e-9)
    assert (second.ttft_s or 0) > (second.send_ttft_s or 0) + 0.4
    assert third.due_s == pytest.approx(2.0) and third.wait_s >= 0.1 / scale * 0.9
    assert (third.ttft_s or 0) >= (third.send_ttft_s or 0) + 0.9
    assert all(
        r.ttft_s == pytest.approx(r.sent_s - r.due_s + (r.send_ttft_s or 0)) for r in (first, second, third)
    )


async def test_a_task_during_the_replay_starts_at_t0_and_is_cancelled_at_its_end(
    server: tuple[str, list[dict[str, object]]],
) -> None:
    """`during` starts with the replay (its t0 is the one the requests' due times count from) and a task
    still running when the last request is done is cancelled and awaited; one that failed fails the
    replay at its end, after every request was recorded."""
    url, _ = server
    wl = Workload("w", "", (req(0), req(1, arrival=1.0)))
    started: list[float] = []
    cancelled = asyncio.Event()

    async def forever(_session: aiohttp.ClientSession, t0: float) -> None:
        started.append(t0)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    before = time.perf_counter()
    records = await replay(wl, rotating([url]), 0.1, 10.0, _progress(2), during=forever)
    assert all(r.ok for r in records) and cancelled.is_set()
    assert before <= started[0] <= before + 0.05

    async def broken(_session: aiohttp.ClientSession, _t0: float) -> None:
        raise RuntimeError("fault endpoint missing")

    with pytest.raises(RuntimeError, match="fault endpoint missing"):
        await replay(wl, rotating([url]), 0.1, 10.0, _progress(2), during=broken)
