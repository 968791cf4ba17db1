"""``PatientTimeout`` and ``Liveness`` (proxy/liveness.py): a first-byte wait past its deadline goes on
only while the replica keeps sending bytes, stops a window after they stop, and never passes its cap."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from proxy.liveness import Liveness, PatientTimeout

REPLICA = "http://127.0.0.1:30000"
WINDOW = 0.1


@contextlib.asynccontextmanager
async def beating(live: Liveness, every_s: float, for_s: float) -> AsyncIterator[None]:
    """The replica sends a byte every ``every_s`` for ``for_s`` seconds (from now), in the background."""
    loop = asyncio.get_running_loop()

    async def beat() -> None:
        end = loop.time() + for_s
        while loop.time() < end:
            live.beat(REPLICA, loop.time())
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
