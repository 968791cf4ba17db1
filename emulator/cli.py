"""`kvroute emulate ...` (== `python -m emulator ...`): parse SGLang-style flags and serve the replicas.

Unknown SGLang flags are accepted; each is named once on stderr. One line
`kvroute-emulator ready http://HOST:PORT` per replica goes to stdout once all of them listen.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp.http_exceptions import BadHttpMessage

from emulator.config import parse_args
from emulator.server import serve


class _DropProtocolNoise(logging.Filter):
    """sglang-router probes every worker for gRPC (an HTTP/2 preface) in parallel with HTTP; aiohttp
    answers 400 as uvicorn does, and this keeps its traceback out of stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, BadHttpMessage)


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None) and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
            return 2
        return int(exc.code or 0)
    logging.getLogger("aiohttp.server").addFilter(_DropProtocolNoise())
    for flag in cfg.ignored_flags:
        print(f"kvroute-emulator: warning: ignoring SGLang flag {flag} (not modelled)", file=sys.stderr)
    try:
        _run(serve(cfg))
    except OSError as exc:
        print(f"kvroute-emulator: {exc}", file=sys.stderr)
        return 1
    return 0
