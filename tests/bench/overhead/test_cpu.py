"""bench/overhead/cpu.py: a process tree's CPU time, read from /proc, counts the descendants and keeps the
time of a child its parent reaped."""

from __future__ import annotations

import math
import subprocess
import sys

from bench.overhead.cpu import tree, tree_cpu_s

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
GRANDCHILD = BURN + "print('burnt', flush=True)\nimport sys\nsys.stdin.read()\n"
CHILD = (
    "import subprocess, sys\n"
    f"g = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], stdin=-1, stdout=-1)\n"
    "g.stdout.readline()\n" + BURN + "print(g.pid, flush=True)\n"
    "sys.stdin.readline()\n"
    "g.stdin.close(); g.wait()\n"
    "print('reaped', flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_the_tree_counts_a_live_grandchild_then_keeps_its_time_once_reaped() -> None:
    argv = [sys.executable, "-c", CHILD]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert tree(child.pid) == [child.pid, grandchild]
        both = tree_cpu_s(child.pid)
        assert both >= 0.55  # two burns of 0.3 s of CPU each, at one clock tick's resolution
        assert tree_cpu_s(grandchild) >= 0.28
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "reaped"
        assert tree(child.pid) == [child.pid]
        assert tree_cpu_s(child.pid) >= both  # the reaped grandchild's time is now the child's cutime
        child.stdin.close()
        assert child.wait(timeout=30) == 0


def test_a_process_that_is_gone_has_no_cpu_time() -> None:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as probe:
        probe.wait()
    assert math.isnan(tree_cpu_s(probe.pid))
