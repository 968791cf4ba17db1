"""The virtual clock: time jumps to the next timer, in order, and a run that can never end says so."""

from __future__ import annotations

import asyncio

import pytest

from bench.sim.clock import Deadlock, VirtualLoop, run_virtual


async def _ten_minutes(stamps: list[float]) -> str:
    loop = asyncio.get_running_loop()

    async def ticker(period: float, count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(period)
            stamps.append(loop.time())

    await asyncio.gather(ticker(1.5, 400), ticker(60.0, 10))
    return "done"


def test_a_ten_minute_run_ends_at_ten_virtual_minutes() -> None:
    stamps: list[float] = []
    result, end = run_virtual(_ten_minutes(stamps))
    assert result == "done"
    assert end == pytest.approx(600.0)
    assert len(stamps) == 410
    assert stamps == sorted(stamps)
    assert stamps[-1] == pytest.approx(600.0)
    assert 60.0 in [round(s, 9) for s in stamps]


def test_timers_fire_at_their_virtual_times_in_order() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float]] = []
        done = asyncio.Event()
        loop.call_at(30.0, lambda: fired.append(("c", loop.time())))
        loop.call_at(10.0, lambda: fired.append(("a", loop.time())))
        loop.call_later(20.0, lambda: fired.append(("b", loop.time())))
        loop.call_at(30.0, done.set)
        await done.wait()
        return fired

    fired, end = run_virtual(main())
    assert fired == [("a", 10.0), ("b", 20.0), ("c", 30.0)]
    assert end == 30.0


def test_the_clock_starts_at_zero_and_stands_still_without_timers() -> None:
    loop = VirtualLoop()
    try:
        assert loop.time() == 0.0
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
        assert loop.time() == 0.0
    finally:
        loop.close()


def test_a_task_waiting_for_ever_is_a_deadlock() -> None:
    async def stuck() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        run_virtual(stuck())
