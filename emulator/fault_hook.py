"""Where armed faults (faults.py, only with --emu-enable-faults) act on live requests.

Two places, in this order for a generation request:

1. The server's frame middleware, before any handler: `probe_fails` answers a health probe with 503
   while an "unhealthy" fault or a restart's down time lasts; `reset` drops a generation request's
   connection with a TCP RST (SO_LINGER 0) after reading its body, then waits for the cancellation the
   lost connection brings (an armed "reset", or any generation request while the replica is down).
2. The generation handler, once the request is parsed: `request_fault` consumes one armed fail / hang /
   cut_stream and says what to do: answer `fail_status`, or cut the stream after `cut_after` events; a
   "hang" never returns (the handler waits until the client leaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass

from aiohttp import web

from emulator.faults import Faults

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP RST


@dataclass(frozen=True, slots=True)
class RequestFault:
    """What one generation request must suffer: nothing (both None), a status, or a cut stream."""

    fail_status: int | None = None
    cut_after: int | None = None


NO_FAULT = RequestFault()


async def request_fault(faults: Faults | None, streaming: bool) -> RequestFault:
    """The fault armed for this request (`faults` None: faults are off); a "hang" never returns."""
    fault = faults.take(streaming) if faults is not None else None
    if fault is None:
        return NO_FAULT
    if fault.kind == "hang":
        await asyncio.Event().wait()
    if fault.kind == "fail":
        return RequestFault(fail_status=fault.status)
    return RequestFault(cut_after=fault.after_chunks)


def probe_fails(faults: Faults) -> bool:
    """True if a health probe arriving now must answer 503 (consumes one count of the fault)."""
    return faults.probe_fails(asyncio.get_running_loop().time())


async def reset(request: web.Request) -> None:
    """Read the body (the client finished sending), send a TCP RST, then wait to be cancelled."""
    with contextlib.suppress(web.HTTPException):
        await request.read()
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
        transport.abort()
    await asyncio.Event().wait()
