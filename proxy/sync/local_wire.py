"""The local channel's wire: how the ``--workers`` supervisor and its workers talk over a Unix socket.

The channel's address is a URL, ``kvroute+unix:///PATH/hub.sock`` (``hub_url``): the supervisor gives it
to its workers as their ``--state``, and ``proxy.sync.redis_store.store_from_url`` knows it. The socket
lives in a directory of its own that only its user may enter (``mkdtemp``: mode 0700).

A message is a frame: a 4-byte big-endian length, then that many bytes of JSON. A call is
``[id, op, args]`` (``args`` an object); its answer ``[id, true, value]`` or ``[id, false, error]``.
Answers may come in any order (a blocking read waits while other calls are answered). JSON the sender
already holds (a batch of events, a document) travels as is (``orjson.Fragment``); bytes that may not be
JSON (a cached answer) travel in base64.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any
from urllib.parse import urlsplit

import orjson

SCHEME = "kvroute+unix"
MAX_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct(">I")


class ChannelError(RuntimeError):
    """The other end broke the protocol, or said the call failed."""


def hub_url(path: str) -> str:
    return f"{SCHEME}://{path}"


def hub_path(url: str) -> str:
    """The socket path of a ``kvroute+unix://`` URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or not parts.path or parts.netloc:
        raise ValueError(f"expected {SCHEME}:///PATH, got {url!r}")
    return parts.path


def frame(message: Any) -> bytes:
    body = orjson.dumps(message)
    return _LEN.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; ``asyncio.IncompleteReadError`` at the end of the stream."""
    (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if size > MAX_FRAME:
        raise ChannelError(f"a frame of {size} bytes: over the {MAX_FRAME}-byte bound")
    return orjson.loads(await reader.readexactly(size))
