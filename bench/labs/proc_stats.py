"""A process's resident memory and open file descriptors, from /proc (Linux), for bench.labs.fuzz and
bench.labs.soak. Both return 0 when the process is gone."""

from __future__ import annotations

import os


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (/proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """How many file descriptors ``pid`` has open (/proc/PID/fd)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0
