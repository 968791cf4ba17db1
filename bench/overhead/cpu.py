"""A process tree's own CPU time, from /proc (Linux): what a gateway spends per request, whatever else runs.

``tree_cpu_s(pid)`` sums ``utime + stime + cutime + cstime`` (fields 14-17 of ``/proc/<pid>/stat``, in
clock ticks) over ``pid`` and every live descendant (found through each process's parent id, field 4: the
kernel here has no ``/proc/<pid>/task/<tid>/children``). Counting the reaped children's times too keeps the
sum continuous when a child exits and is reaped between two samples (its time moves from its own line to
its parent's ``cutime``), so a supervisor with ``--workers N`` counts all its workers. Other processes on
the machine do not change the figure (they may slow the tree down, not add to its CPU time). The
resolution is one clock tick (``SC_CLK_TCK``, usually 10 ms): differences over a whole case are what to
read, not over one request. Without /proc the sampler returns NaN.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
NAN = float("nan")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses):
    index 0 is field 3 (state), so field k is at index k - 3."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _parents() -> dict[int, list[int]]:
    """parent pid -> its children's pids, for every process /proc lists now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (breadth first)."""
    children, out = _parents(), [pid]
    for p in out:
        out.extend(children.get(p, ()))
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by ``pid``, its live descendants and the children they reaped (NaN when
    ``pid`` is gone or /proc is missing)."""
    if _stat(pid) is None:
        return NAN
    ticks = 0
    for p in tree(pid):
        fields = _stat(p)
        if fields is not None:
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")
