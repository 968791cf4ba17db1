"""``PatientTimeout`` and ``Liveness`` (proxy/upstream/liveness.py): a first-byte wait past its deadline goes
on only while the replica keeps sending body bytes (not headers), stops a window after they stop, and never
passes its cap, one cap for a request's send and its first chunk (``Upstream``, on a loopback server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from proxy.errors import UpstreamTimeout
from proxy.upstream.client import Upstream
from proxy.upstream.liveness import FirstByteWait, Liveness, PatientTimeout

REPLICA = "http://127.0.0.1:30000"
WINDOW = 0.1


@contextlib.asynccontextmanager
async def beating(
    live: Liveness, every_s: float, for_s: float, replica: str = REPLICA
) -> AsyncIterator[None]:
    """The replica sends a byte every ``every_s`` for ``for_s`` seconds (from now), in the background."""
    loop = asyncio.get_running_loop()

    async def beat() -> None:
        end = loop.time() + for_s
        while loop.time() < end:
            live.beat(replica, loop.time())
            await asyncio.sleep(every_s)

    task = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait(
    live: Liveness, deadline_in: float, cap_in: float, answer_in: float
) -> tuple[bool, float, int]:
    """(answered, seconds waited, extensions) for an answer due in ``answer_in`` seconds."""
    loop = asyncio.get_running_loop()
    t0, told = loop.time(), []
    timer = PatientTimeout(
        t0 + deadline_in, t0 + cap_in, lambda: live.working_until(REPLICA), lambda: told.append(1)
    )
    try:
        async with timer:
            await asyncio.sleep(answer_in)
        return True, loop.time() - t0, len(told)
    except TimeoutError:
        return False, loop.time() - t0, len(told)


async def test_a_silent_replica_times_out_at_the_deadline() -> None:
    answered, waited, told = await wait(Liveness(WINDOW), 0.05, 10.0, 5.0)
    assert not answered and 0.05 <= waited < 1.0 and told == 0


async def test_a_working_replica_keeps_the_wait_until_the_answer() -> None:
    live = Liveness(WINDOW)
    async with beating(live, 0.01, 10.0):
        answered, waited, told = await wait(live, 0.05, 10.0, 0.5)
    assert answered and waited >= 0.5 and told == 1  # told once, however often it went on


async def test_the_wait_ends_a_window_after_the_replica_goes_quiet() -> None:
    live = Liveness(WINDOW)
    async with beating(live, 0.01, 0.3):
        answered, waited, told = await wait(live, 0.05, 10.0, 5.0)
    assert not answered and 0.3 <= waited < 2.0 and told == 1


async def test_the_wait_never_passes_its_cap() -> None:
    live = Liveness(WINDOW)
    async with beating(live, 0.01, 10.0):
        answered, waited, _ = await wait(live, 0.05, 0.3, 5.0)
    assert not answered and 0.3 <= waited < 2.0


async def test_an_answer_before_the_deadline_is_not_touched() -> None:
    answered, waited, told = await wait(Liveness(WINDOW), 1.0, 10.0, 0.01)
    assert answered and waited < 1.0 and told == 0


@pytest.mark.parametrize("last", [None, 5.0])
def test_working_until_is_the_last_byte_plus_the_window(last: float | None) -> None:
    live = Liveness(WINDOW)
    if last is not None:
        live.beat(REPLICA, last)
    assert live.working_until(REPLICA) == (None if last is None else last + WINDOW)
    assert live.working_until("http://127.0.0.1:1") is None  # per replica


def test_bytes_another_gateway_saw_count_but_are_never_shared_again() -> None:
    live = Liveness(WINDOW)
    live.heard(REPLICA, 7.0)
    live.heard(REPLICA, 6.0)  # an older report does not move it back
    assert live.working_until(REPLICA) == 7.0 + WINDOW
    assert live.quiet_s(REPLICA, 8.0) is None  # only own bytes are exported: no echo between gateways
    live.beat(REPLICA, 7.5)
    assert live.quiet_s(REPLICA, 8.0) == 0.5 and live.working_until(REPLICA) == 7.5 + WINDOW


@contextlib.asynccontextmanager
async def replica(headers_after: float, body_after: float) -> AsyncIterator[str]:
    """A real loopback HTTP server: response headers ``headers_after`` s after the request, its first
    body bytes ``body_after`` s after those."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(headers_after)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(body_after)
        await resp.write(b"data: {}\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def first_byte(url: str, live: Liveness, deadline_in: float, max_wait_s: float) -> float:
    """Seconds until ``url``'s first body bytes through ``Upstream`` (send, then the first chunk, as a
    routed stream does, both under one attempt's cap); raises ``UpstreamTimeout``."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with aiohttp.ClientSession() as session:
        up = Upstream(session, 1.0, live)
        wait = FirstByteWait(t0 + deadline_in, t0 + max_wait_s)
        resp = await up.send(url, "POST", "/v1/chat/completions", {}, b"{}", wait)
        try:
            await up.next_chunk(resp, url, wait)
        finally:
            resp.release()
    return loop.time() - t0


async def test_response_headers_are_not_a_sign_of_work() -> None:
    """SGLang sends a stream's headers at once, even while its scheduler is stuck: they must not keep a
    first-byte wait going (a window of 5 s would, if they counted)."""
    live = Liveness(5.0)
    async with replica(0.0, 3.0) as url:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamTimeout):
            await first_byte(url, live, 0.2, 10.0)
        assert asyncio.get_running_loop().time() - t0 < 1.5


async def test_send_and_first_chunk_share_one_cap() -> None:
    """The replica works all along (another request's bytes), the headers take 0.4 s and the body 0.4 s
    more: with a 0.6 s cap for the whole wait the attempt ends at 0.6 s; a cap per step would let it
    answer at 0.8 s."""
    live = Liveness(WINDOW)
    async with replica(0.4, 0.4) as url, beating(live, 0.01, 10.0, url):
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamTimeout):
            await first_byte(url, live, 0.05, 0.6)
        assert 0.55 <= asyncio.get_running_loop().time() - t0 < 0.78
        assert await first_byte(url, live, 0.05, 2.0) >= 0.8  # the same wait under a longer cap
