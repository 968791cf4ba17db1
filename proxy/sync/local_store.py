"""A worker's end of the local channel (``--workers`` without ``--state``): the supervisor's hub as a store.

``LocalStore`` speaks ``proxy/sync/local_wire.py`` to ``proxy/sync/local_hub.py`` over one Unix-socket
connection (opened at the first call, opened again after it broke) and is three stores in one, as the
Redis ones are for ``--state redis://``: the state store (``proxy.sync.state_store.StateStore``, for
``proxy/sync/state_sync.py``), the rate-limit buckets (``proxy.tenancy.shared_limits.BucketStore``), and
the response cache's store (``LocalAnswers``, ``proxy/answers/store.py``'s ``Store``). Calls are
multiplexed on the connection: each waits for its own answer, bounded by ``timeout_s`` (a blocking read
by its block time more), and raises ``ConnectionError`` or ``TimeoutError`` when the hub is gone or slow,
which each user of the store tolerates as it does a Redis outage.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.sync.local_wire import ChannelError, frame, hub_path, read_frame
from proxy.sync.state_store import Batch, Doc, batch_of, encode
from routing.sharing import Event

log = logging.getLogger("kvroute.hub")
TIMEOUT_S = 1.0


class LocalStore:
    name = "local"

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.path, self.timeout_s = hub_path(url), timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._opening = asyncio.Lock()
        self._me = ""  # the gateway publishing through this store: its own pulses do not wake it
        self._pulse_at = 0

    async def call(self, op: str, args: dict[str, Any], timeout_s: float | None = None) -> Any:
        writer = await self._open()
        self._next += 1
        rid = self._next
        fut = self._pending[rid] = asyncio.get_running_loop().create_future()
        try:
            writer.write(frame([rid, op, args]))
            return await asyncio.wait_for(fut, self.timeout_s if timeout_s is None else timeout_s)
        finally:
            self._pending.pop(rid, None)

    async def _open(self) -> asyncio.StreamWriter:
        async with self._opening:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            opening = asyncio.open_unix_connection(self.path)
            reader, writer = await asyncio.wait_for(opening, self.timeout_s)
            self._reading = asyncio.get_running_loop().create_task(self._answers(reader, writer))
            self._writer = writer
            return writer

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hands each answer to its call; when the connection ends, every waiting call fails."""
        try:
            while True:
                rid, ok, value = await read_frame(reader)
                fut = self._pending.get(rid)
                if fut is None or fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(ChannelError(str(value)))
        except (asyncio.IncompleteReadError, ConnectionError, ChannelError, ValueError, TypeError):
            pass
        finally:
            writer.close()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the local channel closed"))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading

    # the state store (proxy.sync.state_store.StateStore)

    async def publish(
        self, gateway: str, events: Sequence[Event], docs: Mapping[str, Doc], pulse: bool = True
    ) -> None:
        self._me = gateway
        batch = orjson.Fragment(encode(Batch(gateway, tuple(events)))) if events else None
        shared = {k: [orjson.Fragment(d.data), d.ttl_s] for k, d in docs.items()}
        await self.call("publish", {"g": gateway, "b": batch, "d": shared, "p": pulse})

    async def read(self, since: str, block_s: float = 0.0) -> tuple[list[tuple[str, Batch]], str]:
        """As ``RedisStore.read``: another worker's pulse comes back as an empty batch of that worker."""
        args = {"since": int(since), "block": block_s, "me": self._me, "pulse": self._pulse_at}
        found = await self.call("read", args, self.timeout_s + block_s)
        position = str(found["end"])
        self._pulse_at = int(found["pulse"])
        out = [(position, batch_of(doc)) for doc in found["b"]]
        return out + [(position, Batch(str(g), ())) for g in found["pulsed"]], position

    async def gather(self, kinds: Sequence[str], skip: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = await self.call("gather", {"kinds": list(kinds), "skip": skip})
        return found

    async def leave(self, gateway: str, kinds: Sequence[str]) -> None:
        await self.call("leave", {"g": gateway, "kinds": list(kinds)})

    # the rate-limit buckets (proxy.tenancy.shared_limits.BucketStore)

    async def take(self, bucket: str, per_minute: int, need: float, want: float) -> tuple[float, float]:
        granted, wait = await self.call("take", {"b": bucket, "pm": per_minute, "need": need, "want": want})
        return float(granted), float(wait)

    async def give(self, bucket: str, per_minute: int, amount: float) -> None:
        await self.call("give", {"b": bucket, "pm": per_minute, "amount": amount})


class ChannelUnavailable(Exception):
    """A strict ``LocalAnswers`` could not reach the hub."""


class LocalAnswers:
    """A store of answers in the hub (``space``: the response cache's, or the Responses API's state).
    Not ``strict`` (the cache): a failed call is a miss or a dropped write, never an error for the
    client (as the Redis store's), said once per outage; ``strict`` (Responses): ``ChannelUnavailable``."""

    name = "local"

    def __init__(self, url: str, max_bytes: int, space: str = "cache", strict: bool = False) -> None:
        self.store, self.max_bytes, self.space, self.strict = LocalStore(url), max_bytes, space, strict
        self.down = False

    async def get(self, key: str) -> bytes | None:
        return _unb64(await self._call("get", {"k": key}))

    async def put(self, key: str, value: bytes) -> bool:
        if len(key) + len(value) > self.max_bytes:
            return False
        return await self._call("put", {"k": key, "v": base64.b64encode(value).decode()}) is True

    async def delete(self, key: str) -> bool:
        return await self._call("delete", {"k": key}) is True

    async def get_many(self, keys: list[str], renew: Sequence[str] = ()) -> list[bytes | None]:
        found = await self._call("get_many", {"k": keys, "r": list(renew)})
        return [_unb64(f) for f in found] if isinstance(found, list) else [None] * len(keys)

    async def _call(self, op: str, args: dict[str, Any]) -> Any:
        try:
            result = await self.store.call(op, args | {"s": self.space})
        except (ConnectionError, TimeoutError, OSError, ChannelError) as e:
            if self.strict:
                raise ChannelUnavailable(f"the local channel: {type(e).__name__}") from None
            if not self.down:
                log.warning("response cache: the local channel is unavailable (%s); serving uncached", e)
            self.down = True
            return None
        if self.down:
            log.warning("response cache: the local channel answers again; the cache is back")
            self.down = False
        return result

    async def close(self) -> None:
        await self.store.close()


def _unb64(found: object) -> bytes | None:
    return base64.b64decode(found) if isinstance(found, str) else None
