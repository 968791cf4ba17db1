"""The ``--workers`` supervisor on its own (``proxy/runtime/supervisor.py``): its restart policy, and the
supervisor running small real worker processes (a few lines of Python that print a ready line and then
exit as told), so that deaths, the give-up and a failed start are seen in seconds. The supervisor over
real gateway workers is tests/proxy/runtime/test_workers.py."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from proxy.runtime.supervisor import RestartPolicy, Supervisor, reserve_port

FAST = RestartPolicy(first_s=0.01, max_s=0.02, window_s=60.0, max_deaths=3)


def test_the_backoff_doubles_and_gives_up_past_the_deaths_of_a_window() -> None:
    p = RestartPolicy(first_s=0.5, max_s=4.0, window_s=60.0, max_deaths=5)
    assert p.delay_s([100.0], 100.0) == 0.5
    assert p.delay_s([98.0, 100.0], 100.0) == 1.0
    assert p.delay_s([96.0, 98.0, 99.0, 100.0], 100.0) == 4.0  # 0.5 x 2^3, at the cap
    assert p.delay_s([0.0, 10.0, 20.0, 30.0, 100.0], 100.0) == 0.5  # the old deaths are forgotten
    assert p.delay_s([60.0, 70.0, 80.0, 90.0, 100.0], 100.0) is None  # five within a minute


def _worker(tmp_path: Path, then: str) -> list[str]:
    """A worker that notes its start in ``starts``, prints a ready line, then runs ``then``."""
    code = (
        "import os, sys, time\n"
        f"open({str(tmp_path / 'starts')!r}, 'a').write(os.environ['KVROUTE_WORKER'] + '\\n')\n"
        f"{then}\n"
    )
    return [sys.executable, "-c", code]


async def test_workers_that_keep_dying_end_the_supervisor_with_1(tmp_path: Path) -> None:
    ready = "print('kvroute ready http://127.0.0.1:1 now', flush=True); time.sleep(0.05); sys.exit(1)"
    announced: list[str] = []
    sup = Supervisor(_worker(tmp_path, ready), 2, drain_timeout_s=1.0, policy=FAST)
    assert await sup.run(announced.append) == 1
    assert announced == ["http://127.0.0.1:1"]  # once, when both were ready
    starts = (tmp_path / "starts").read_text().split()
    # restarted after each of the first deaths, not after the one that makes too many
    assert sorted(set(starts)) == ["0", "1"] and 3 <= len(starts) <= 2 + FAST.max_deaths - 1


async def test_a_worker_that_fails_before_it_is_ready_stops_the_start(tmp_path: Path) -> None:
    fails = "sys.exit(3) if os.environ['KVROUTE_WORKER'] == '1' else time.sleep(30)"
    announced: list[str] = []
    sup = Supervisor(_worker(tmp_path, fails), 2, drain_timeout_s=1.0, policy=FAST)
    assert await sup.run(announced.append) == 3
    assert announced == [] and all(w.proc.returncode is not None for w in sup.workers.values())


async def test_the_port_is_held_for_the_workers_and_a_taken_one_is_refused() -> None:
    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    sibling = socket.socket()
    sibling.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sibling.bind(("127.0.0.1", port))  # a worker binds it beside the supervisor
    sibling.listen()
    sibling.close()
    held.close()
    taken = socket.socket()  # a listener without SO_REUSEPORT: nobody may share it
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError):
            reserve_port("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
