"""bench/runs/cpu.py tells our own CPU (and reaped children's) from other processes' on the machine."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.reports import tables as report
from bench.runs.cpu import CpuMeter

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"


def test_a_reaped_child_is_ours_and_a_running_process_is_foreign() -> None:
    meter = CpuMeter()
    subprocess.run([sys.executable, "-c", BURN], check=True)  # reaped: counted as ours
    ours = meter.stop()
    assert ours.busy_cores * ours.wall_s >= 0.5  # the machine was busy for at least the burn
    assert ours.foreign_cores * ours.wall_s < ours.busy_cores * ours.wall_s - 0.4
    other = subprocess.Popen([sys.executable, "-c", BURN])
    meter = CpuMeter()
    time.sleep(0.5)  # it burns while we wait; not reaped yet when the meter stops: someone else's CPU
    use = meter.stop()
    other.wait()
    assert use.foreign_cores * use.wall_s >= 0.3


def test_a_disturbed_run_is_named_under_its_table() -> None:
    quiet = report.Summary("a", 4, 0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 2, 3.0, 1.0, foreign_cpu=0.05)
    noisy = report.Summary("b", 4, 0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 2, 3.0, 1.0, foreign_cpu=0.9)
    assert report.notes([quiet, noisy], {}) == [
        "- b: other processes on the machine used 0.90 cores on average during its run (its TTFTs may be"
        " inflated)"
    ]
    assert (
        report.aggregate([[quiet], [report.Summary("a", 4, 0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 2, 3.0, 1.0)]])[
            0
        ].foreign_cpu
        == 0.05
    )
