"""Where the gateway keeps responses and conversations, each under its owner.

**The store**: with ``--state redis://...`` (or ``rediss://``, ``unix://``, ``redis+cluster://``,
``redis+sentinel://``) Redis, shared by every gateway of the fleet (``proxy.answers.store.RedisStore``,
strict: an unreachable Redis is a 503 ``state_unavailable``, never a wrong 404); with ``--workers N`` and
no ``--state``, the supervisor's hub on the local channel (``proxy.sync.local_store.LocalAnswers``,
strict too), shared by the workers; otherwise this process (``proxy.answers.store.MemoryStore``: least
recently used first out, past ``responses_max_bytes`` or ``responses_max_entries``). Every entry lives
``responses_ttl`` seconds from its last write, and the responses of a chain are renewed each time it is
continued. No single entry is larger than ``responses_max_bytes``.

**Keys**: ``kvroute:{NS}:responses:<owner>:resp:<id>`` and ``...:conv:<id>`` (NS: ``--state-namespace``,
one cluster slot), ``<owner>`` the first 16 hex digits of the SHA-256 of the owner: the caller's
``ApiKey.bucket`` (its tenant, or the key alone), "" on a gateway without ``--api-keys`` (everyone is one
owner there). A lookup by another owner finds nothing: the same 404 as an unknown id. Values hold no
credential; they hold the items (prompts and answers), as SGLang's own store does.

A ``Record`` (a response) holds its id, the object the client got (patched, ``proxy/responses/echo.py``),
this turn's own input items, ``previous_response_id``, ``ancestors`` (the chain's ids, oldest first: a
chain is read back in one ``MGET``) and its conversation. A ``Conversation`` holds its metadata and its
items (oldest first, in the listed shape of ``proxy/responses/items.py``); writes to one conversation are
serialized within a gateway (between gateways the last write wins).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from aiohttp import web

from proxy.answers.store import MemoryStore, RedisStore, Store, StoreUnavailable
from proxy.config.settings import Settings
from proxy.errors import GatewayError, InvalidRequest, NotFound
from proxy.sync.local_store import ChannelUnavailable, LocalAnswers
from proxy.sync.local_wire import SCHEME
from proxy.sync.redis_store import connect
from proxy.tenancy.namespace import CLIENT_KEY
from proxy.types import JSONObject

MAX_CHAIN = 1000  # responses in one chain
REDIS_TIMEOUT_S = 1.0
T = TypeVar("T")
S = TypeVar("S")


class StateUnavailable(GatewayError):
    status, type, code = 503, "service_unavailable", "state_unavailable"


def owner_of(request: web.Request) -> str:
    """Whose ids these are: the client key's bucket, or "" without ``--api-keys``."""
    key = request.get(CLIENT_KEY)
    return key.bucket if key is not None else ""


@dataclass(slots=True)
class Record:
    id: str
    response: JSONObject
    input: list[Any]
    previous_response_id: str | None = None
    ancestors: list[str] = field(default_factory=list)
    conversation_id: str | None = None

    @property
    def status(self) -> str:
        return str(self.response.get("status"))

    @property
    def done(self) -> bool:
        return self.status not in ("queued", "in_progress")

    @property
    def items(self) -> list[Any]:
        """What this turn adds to a chain: its input items, then its output items."""
        output = self.response.get("output")
        return [*self.input, *(output if isinstance(output, list) else [])]

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # a dataclass, serialized natively (asdict would deep-copy it)

    @classmethod
    def from_json(cls, raw: bytes | None) -> Record | None:
        return _stored(cls, raw, "response", dict)


@dataclass(slots=True)
class Conversation:
    id: str
    created_at: int
    metadata: JSONObject
    items: list[JSONObject] = field(default_factory=list)

    def public(self) -> JSONObject:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # a dataclass, serialized natively (asdict would deep-copy it)

    @classmethod
    def from_json(cls, raw: bytes | None) -> Conversation | None:
        return _stored(cls, raw, "items", list)


def _stored(cls: Callable[..., S], raw: bytes | None, key: str, kind: type) -> S | None:
    """``cls`` from its stored JSON, or None when ``raw`` is not one (no such record, or another layout:
    ``key`` missing or not of ``kind``, or fields ``cls`` does not take)."""
    doc = _doc(raw)
    try:
        return cls(**doc) if doc is not None and isinstance(doc.get(key), kind) else None
    except TypeError:  # another layout
        return None


def _doc(raw: bytes | None) -> JSONObject | None:
    try:
        doc = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


def conversation_not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation_id")


class ResponsesState:
    """Records and conversations in one store, per owner (module docstring)."""

    def __init__(self, store: Store, namespace: str) -> None:
        self.store = store
        self._prefix = "kvroute:{" + namespace + "}:responses:"
        self.tasks: dict[str, asyncio.Task[None]] = {}  # background responses running in this gateway
        self.closing = False  # the gateway stops: its background responses end as failed
        self._locks: dict[str, asyncio.Lock] = {}

    def _key(self, owner: str, kind: str, ident: str) -> str:
        return f"{self._prefix}{hashlib.sha256(owner.encode()).hexdigest()[:16]}:{kind}:{ident}"

    async def _call(self, op: Awaitable[T]) -> T:
        try:
            return await op
        except (StoreUnavailable, ChannelUnavailable) as e:
            raise StateUnavailable(str(e)) from None

    async def get(self, owner: str, response_id: str) -> Record | None:
        return Record.from_json(await self._call(self.store.get(self._key(owner, "resp", response_id))))

    async def put(self, owner: str, record: Record) -> bool:
        return await self._call(self.store.put(self._key(owner, "resp", record.id), record.to_json()))

    async def delete(self, owner: str, response_id: str) -> bool:
        return await self._call(self.store.delete(self._key(owner, "resp", response_id)))

    async def chain(self, owner: str, previous: str) -> list[Record]:
        """The chain ending with ``previous``, oldest first (each renewed); 404 when a link is gone."""
        last = await self.get(owner, previous)
        if last is None:
            raise NotFound(
                f"Previous response with id '{previous}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if not last.done:
            raise InvalidRequest(
                f"Previous response with id '{previous}' is still {last.status}: wait for it to finish",
                param="previous_response_id",
            )
        if len(last.ancestors) >= MAX_CHAIN:
            raise InvalidRequest(f"a chain holds at most {MAX_CHAIN} responses", param="previous_response_id")
        keys = [self._key(owner, "resp", a) for a in last.ancestors]
        renew = [*keys, self._key(owner, "resp", previous)]
        found = [Record.from_json(raw) for raw in await self._call(self.store.get_many(keys, renew))]
        missing = [a for a, r in zip(last.ancestors, found, strict=True) if r is None]
        if missing:
            raise NotFound(
                f"Response with id '{missing[0]}', earlier in the chain of '{previous}', not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return [r for r in found if r is not None] + [last]

    async def conversation(self, owner: str, conversation_id: str) -> Conversation | None:
        raw = await self._call(self.store.get(self._key(owner, "conv", conversation_id)))
        return Conversation.from_json(raw)

    async def put_conversation(self, owner: str, conv: Conversation) -> None:
        if not await self._call(self.store.put(self._key(owner, "conv", conv.id), conv.to_json())):
            raise InvalidRequest(
                f"conversation '{conv.id}' would exceed the largest entry kept (responses_max_bytes)",
                param="items",
                code="conversation_too_large",
            )

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        return await self._call(self.store.delete(self._key(owner, "conv", conversation_id)))

    def lock(self, owner: str, conversation_id: str) -> asyncio.Lock:
        """The lock of one conversation's writes in this gateway (dropped when nobody holds it)."""
        key = self._key(owner, "conv", conversation_id)
        if len(self._locks) > 1024:
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        return self._locks.setdefault(key, asyncio.Lock())

    async def close(self) -> None:
        self.closing = True
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.close()


def make_state(st: Settings) -> ResponsesState:
    """Redis with ``--state redis://...``, the supervisor's hub for ``--workers``, else this process
    (module docstring)."""
    url = st.state
    if url is None or url == "memory":
        return ResponsesState(
            MemoryStore(st.responses_ttl, st.responses_max_bytes, st.responses_max_entries), ""
        )
    if url.startswith(SCHEME + "://"):
        return ResponsesState(LocalAnswers(url, st.responses_max_bytes, "responses", strict=True), "")
    store = RedisStore(
        url, st.responses_ttl, st.responses_max_bytes, REDIS_TIMEOUT_S, client=connect(url), strict=True
    )
    return ResponsesState(store, st.state_namespace)


RESPONSES: web.AppKey[ResponsesState] = web.AppKey("responses_state", ResponsesState)
