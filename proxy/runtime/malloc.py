"""Keep large request buffers on the heap: glibc's ``mallopt`` thresholds for the gateway process.

A 128K-token prompt is ~0.5 MB of JSON; the gateway parses it, and routing renders and encodes its
canonical text: several 0.5 MB buffers per request, each freed before the next request. glibc serves
allocations above ``M_MMAP_THRESHOLD`` (128 KiB until it adapts) with ``mmap`` and gives freed heap
tops back to the kernel above ``M_TRIM_THRESHOLD``, so every such request page-faults its buffers in
again: measured 1.4 ms against 0.45 ms per 128K-token prompt for render + encode + hash
(``bench/micro/routing.py``). Raising both thresholds keeps those buffers in the process's heap, at the
cost of the heap staying at its high-water mark (a few MB of large prompts in flight).

A no-op where glibc is absent (macOS, musl, Windows) or ``mallopt`` refuses a value.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # the largest value glibc accepts (HEAP_MAX / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def tune_malloc() -> bool:
    """Raises glibc's mmap and trim thresholds; True when both were accepted."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    trim_ok: bool = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return mmap_ok and trim_ok
