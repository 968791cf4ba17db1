"""The local channel's server: what ``--workers`` processes share when no ``--state`` store is given.

The supervisor (``proxy/runtime/supervisor.py``, composed in ``proxy/deployment.py``) hosts one ``Hub``
in its own event loop and serves it on a Unix socket (``proxy/sync/local_wire.py``); each worker reaches
it with ``proxy.sync.local_store.LocalStore``. The hub holds, in memory:

- the state store's log of event batches and each worker's documents (``HubState``: the
  ``proxy.sync.state_store.StateStore`` semantics, as ``MemoryStore`` and ``RedisStore`` have them), with
  reads that block until another worker publishes events or pulses (a round that changed only its
  documents), as Redis' ``XREAD BLOCK`` on the log and the pulse stream does;
- the rate-limit buckets (a ``proxy.tenancy.shared_limits.MemoryBuckets``, given);
- the response cache's answers when ``--response-cache memory`` (its ``MemoryStore``, given: its bounds
  and TTL hold for all workers together), and the Responses API's records and conversations (another
  ``MemoryStore``, bounded by ``--responses-max-bytes`` / ``--responses-max-entries``), so a chain's next
  turn finds its history whichever worker takes it.

A worker's connection that closes (it stopped, or died) takes that worker's documents with it, so the
others stop counting its load at once. Nothing here is written to disk.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

from proxy.sync.local_wire import ChannelError, frame, read_frame
from proxy.sync.state_store import LOG_MAX, live_docs

log = logging.getLogger("kvroute.hub")
READ_COUNT = 2000  # batches per read, as the Redis store's
PULSES = 256
MAX_BLOCK_S = 5.0


class Buckets(Protocol):
    async def take(self, bucket: str, per_minute: int, need: float, want: float) -> tuple[float, float]: ...

    async def give(self, bucket: str, per_minute: int, amount: float) -> None: ...


class Answers(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> bool: ...

    async def delete(self, key: str) -> bool: ...

    async def get_many(self, keys: list[str], renew: Sequence[str] = ()) -> list[bytes | None]: ...


class HubState:
    """The log, the documents and the pulses; reads that block until another worker publishes."""

    def __init__(self) -> None:
        self.log: list[bytes] = []
        self.trimmed = 0
        self.docs: dict[tuple[str, str], tuple[float, bytes]] = {}  # (kind, gateway) -> expiry, JSON
        self.pulses: deque[tuple[int, str]] = deque(maxlen=PULSES)
        self.pulse_seq = 0
        self._waiters: list[tuple[str, asyncio.Future[None]]] = []

    @property
    def end(self) -> int:
        return self.trimmed + len(self.log)

    def publish(
        self, gateway: str, batch: bytes | None, docs: Mapping[str, tuple[bytes, float]], pulse: bool
    ) -> None:
        if batch is not None:
            self.log.append(batch)
            excess = max(0, len(self.log) - LOG_MAX)
            del self.log[:excess]
            self.trimmed += excess
        now = time.monotonic()
        for kind, (data, ttl_s) in docs.items():
            self.docs[(kind, gateway)] = (now + ttl_s, data)
        if pulse and batch is None:
            self.pulse_seq += 1
            self.pulses.append((self.pulse_seq, gateway))
        if batch is not None or pulse:
            self._wake(gateway)

    def _wake(self, gateway: str) -> None:
        for me, fut in self._waiters:
            if me != gateway and not fut.done():
                fut.set_result(None)

    def _pulsed(self, me: str, pulse_at: int) -> list[str]:
        return sorted({g for seq, g in self.pulses if seq > pulse_at and g != me})

    async def read(self, since: int, block_s: float, me: str, pulse_at: int) -> dict[str, Any]:
        if block_s > 0 and since >= self.end and not self._pulsed(me, pulse_at):
            waiter = (me, asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter[1], min(block_s, MAX_BLOCK_S))
            finally:
                self._waiters.remove(waiter)
        start = max(since, self.trimmed) - self.trimmed
        batches = self.log[start : start + READ_COUNT]
        pulsed = self._pulsed(me, pulse_at)
        end = self.trimmed + start + len(batches)
        return {
            "b": [orjson.Fragment(b) for b in batches],
            "end": end,
            "pulse": self.pulse_seq,
            "pulsed": pulsed,
        }

    def gather(self, kinds: Sequence[str], skip: str) -> dict[str, dict[str, Any]]:
        return live_docs(self.docs, kinds, skip, orjson.Fragment)  # sent on as they came

    def leave(self, gateway: str, kinds: Sequence[str] | None = None) -> None:
        for kind, g in list(self.docs):
            if g == gateway and (kinds is None or kind in kinds):
                del self.docs[(kind, g)]


class Hub:
    """``HubState``, the buckets and the answers, served on a Unix socket."""

    def __init__(
        self, buckets: Buckets, answers: Answers | None = None, responses: Answers | None = None
    ) -> None:
        self.state, self.buckets = HubState(), buckets
        self.spaces = {k: v for k, v in (("cache", answers), ("responses", responses)) if v is not None}
        self._server: asyncio.AbstractServer | None = None
        self._open: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}  # the connections being served

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=path)

    @property
    def connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        """Stops listening and ends every connection (their handlers return)."""
        if self._server is not None:
            self._server.close()
        for writer in self._open.values():
            writer.close()
        if self._open:
            await asyncio.wait(list(self._open), timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker connection: its calls, answered as they finish; its documents go with it."""
        me = asyncio.current_task()
        assert me is not None  # asyncio serves each connection in a task of its own
        self._open[me] = writer
        published: set[str] = set()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                rid, op, args = await read_frame(reader)
                if op == "publish":
                    published.add(str(args["g"]))
                task = asyncio.get_running_loop().create_task(self._answer(writer, rid, op, args))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, ChannelError, ValueError, TypeError) as e:
            if not isinstance(e, asyncio.IncompleteReadError | ConnectionError):
                log.warning("local channel: a worker broke the protocol (%s): connection closed", e)
        finally:
            self._open.pop(me, None)
            for task in tasks:
                task.cancel()
            for g in published:
                self.state.leave(g)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, rid: int, op: str, args: dict[str, Any]) -> None:
        try:
            reply = [rid, True, await self._call(op, args)]
        except (KeyError, TypeError, ValueError, ChannelError) as e:
            reply = [rid, False, f"{type(e).__name__}: {e}"]
        if not writer.is_closing():
            writer.write(frame(reply))

    async def _call(self, op: str, a: dict[str, Any]) -> Any:
        st = self.state
        if op == "publish":
            docs = {k: (orjson.dumps(v[0]), float(v[1])) for k, v in a["d"].items()}
            batch = orjson.dumps(a["b"]) if a["b"] is not None else None
            return st.publish(str(a["g"]), batch, docs, bool(a["p"]))
        if op == "read":
            return await st.read(int(a["since"]), float(a["block"]), str(a["me"]), int(a["pulse"]))
        if op == "gather":
            return st.gather([str(k) for k in a["kinds"]], str(a["skip"]))
        if op == "leave":
            return st.leave(str(a["g"]), [str(k) for k in a["kinds"]])
        if op == "take":
            return await self.buckets.take(str(a["b"]), int(a["pm"]), float(a["need"]), float(a["want"]))
        if op == "give":
            return await self.buckets.give(str(a["b"]), int(a["pm"]), float(a["amount"]))
        return await self._answers(op, a)

    async def _answers(self, op: str, a: dict[str, Any]) -> Any:
        space = str(a.get("s", "cache"))
        store = self.spaces.get(space)
        if store is None:
            raise ChannelError(f"this channel keeps no {space} store")
        if op == "get":
            return _b64(await store.get(str(a["k"])))
        if op == "put":
            return await store.put(str(a["k"]), base64.b64decode(a["v"]))
        if op == "delete":
            return await store.delete(str(a["k"]))
        if op == "get_many":
            found = await store.get_many([str(k) for k in a["k"]], [str(k) for k in a["r"]])
            return [_b64(f) for f in found]
        raise ChannelError(f"unknown operation {op!r}")


def _b64(value: bytes | None) -> str | None:
    return base64.b64encode(value).decode() if value is not None else None
