"""Running a diag command's ``main`` from a test: in a thread (it runs its own event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Callable


async def run_main(main: Callable[[list[str]], int], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in a thread, with its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()
