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
``connected``; both mean a peer. Which of the two a feed is: ``publisher_binds`` (SGLang's rule), and
the address it uses: ``connect_endpoint``.
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


def publisher_binds(endpoint: str) -> bool:
    """SGLang's rule: its PUB binds a wildcard address or a local transport (the subscriber connects),
    else it connects (the subscriber binds that address)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def connect_endpoint(endpoint: str, replica_url: str) -> str:
    """The address a subscriber uses: a wildcard host (``*``, ``0.0.0.0``, ``[::]``) in a ``tcp://``
    endpoint means the replica's own host; any other endpoint is used as it is."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if host in ("*", "0.0.0.0", "[::]", "::", ""):
        host = _url_host(replica_url)
    return f"tcp://{host}{sep}{port}"


def _url_host(url: str) -> str:
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    if rest.startswith("["):
        return rest[: rest.index("]") + 1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest
