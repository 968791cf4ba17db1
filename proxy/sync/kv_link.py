"""The state of a KV-event SUB socket's connection, from ZMQ's socket monitor.

ZMQ connects and reconnects in the background, and a SUB never fails on an endpoint nobody listens
on: without a monitor a feed to a wrong port looked "subscribed" for ever. ``Link`` reads the socket's
monitor events and keeps:

- ``state``: ``connecting`` (no peer yet; ``retries`` counts refused attempts), ``connected`` (a peer
  publisher is attached), ``dropped`` (the peer went away: a replica restarting, or killed);
- ``on_reconnect``: called when a peer attaches after one had dropped. A publisher that comes back is
  very likely a new process whose sequence starts again at 0, and whose first batches may be lost to
  ZMQ's slow-joiner window, so that the next batch seen can even look like the old sequence going on:
  the caller has the replica's start time read again at once (``proxy/sync/kv_subscriber.py``), and
  the restart owner decides (``proxy/fleet/restarts.py``).

A SUB that binds (the replica's PUB connects to it) sees ``accepted`` where one that connects sees
``connected``; both mean a peer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED


class Link:
    def __init__(self, sock: zmq.asyncio.Socket, on_reconnect: Callable[[], None]) -> None:
        self.state = "connecting"
        self.retries = 0
        self.reconnects = 0
        self._on_reconnect = on_reconnect
        self._monitor = sock.get_monitor_socket(EVENTS)

    async def run(self) -> None:
        """Follows the monitor until cancelled."""
        while True:
            frames = await self._monitor.recv_multipart()
            self.note(int(parse_monitor_message(frames)["event"]))

    def note(self, event: int) -> None:
        if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
            again = self.state == "dropped"
            self.state, self.retries = "connected", 0
            if again:
                self.reconnects += 1
                self._on_reconnect()
        elif event == zmq.EVENT_DISCONNECTED:
            self.state = "dropped"
        elif event == zmq.EVENT_CONNECT_RETRIED and self.state != "connected":
            self.retries += 1

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._monitor.close(linger=0)


async def follow(link: Link) -> None:
    """``link.run`` as a task body that ends quietly when cancelled or when its socket closes."""
    with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
        await link.run()
