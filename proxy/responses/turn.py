"""One ``POST /v1/responses`` turn's record, written as the turn goes (``proxy/responses/create.py``).

``pending`` is the response before a replica answered (``queued`` or ``in_progress``), shaped as SGLang
shapes one. A ``Turn`` holds the id the gateway minted, the echo of what the client asked
(``proxy/responses/echo.py``) and the record (``proxy/responses/state.py``):

- ``begin``: a stored stream or background turn is recorded from its start, so GET and cancel find it
  mid-flight; a whole answer is stored when it completes, as SGLang does;
- ``finish``: the final response stored (a begun record only while it is still there, and still
  ``cancelled`` if it was cancelled meanwhile) and this turn's input and output items appended to its
  conversation; ``failed`` stores a ``failed`` response with a ``server_error`` (nothing linked);
  ``discard`` removes a begun record when the client got an error instead of a response.

A store that fails is logged (ids only, never items) and the turn goes on: the client still gets its
answer, unstored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

from proxy.responses.echo import Echo
from proxy.responses.items import listed, new_id
from proxy.responses.request import CreateRequest
from proxy.responses.state import Record, ResponsesState, StateUnavailable
from proxy.types import JSONObject

log = logging.getLogger("kvroute.responses")


def pending(req: CreateRequest, rid: str, status: str) -> JSONObject:
    """The response before a replica answered (``queued`` or ``in_progress``), as SGLang shapes it."""
    b = req.body
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": req.model,
        "output": [],
        "status": status,
        "usage": None,
        "background": req.background,
        "error": None,
        "incomplete_details": None,
        "instructions": b.get("instructions"),
        "max_output_tokens": b.get("max_output_tokens"),
        "metadata": b.get("metadata") or {},
        "parallel_tool_calls": b.get("parallel_tool_calls") is not False,
        "previous_response_id": req.previous_response_id,
        "store": req.store,
        "temperature": b.get("temperature"),
        "tool_choice": b.get("tool_choice", "auto"),
        "tools": b.get("tools") or [],
        "top_p": b.get("top_p"),
        "truncation": b.get("truncation", "disabled"),
        "user": b.get("user"),
    }


@dataclass
class Turn:
    """One create's state: its record, written as the turn goes (module docstring)."""

    state: ResponsesState
    owner: str
    req: CreateRequest
    echo: Echo
    record: Record
    begun: bool = False  # its record is in the store since the start

    @property
    def watched(self) -> bool:
        """Recorded from its start, for GET and cancel mid-flight: a stored stream or background turn
        (a whole answer is stored when it completes, as SGLang does)."""
        return self.req.store and (self.req.stream or self.req.background)

    async def begin(self) -> None:
        """The record of a watched turn, from now on; a store that fails is logged and the turn goes on
        unstored (a client that never chains loses nothing; one that does gets the store's 503 then)."""
        if not self.watched:
            return
        try:
            await self.state.put(self.owner, self.record)
            self.begun = True
        except StateUnavailable as e:
            log.warning("response %s will not be stored: %s", self.record.id, e.message)

    async def finish(self, response: JSONObject, link: bool = True) -> None:
        """The final response stored (a begun record: unless deleted meanwhile, and still ``cancelled``
        if cancelled) and, with ``link``, this turn's items added to its conversation. A store that
        fails is logged: the client still gets its answer."""
        try:
            await self._finish(response, link)
        except StateUnavailable as e:
            log.warning("response %s was answered but not stored: %s", self.record.id, e.message)

    async def _finish(self, response: JSONObject, link: bool) -> None:
        current = await self.state.get(self.owner, self.record.id) if self.begun else self.record
        if self.req.store and current is not None:
            if current.status == "cancelled":
                response = {**response, "status": "cancelled"}
            self.record.response = response
            await self.state.put(self.owner, self.record)
        if link and self.record.conversation_id is not None:
            await self._link(self.record.conversation_id, response)

    async def _link(self, conversation_id: str, response: JSONObject) -> None:
        async with self.state.lock(self.owner, conversation_id):
            conv = await self.state.conversation(self.owner, conversation_id)
            if conv is None:
                return
            output = response.get("output")
            items = [*self.record.input, *(output if isinstance(output, list) else [])]
            conv.items.extend(listed(item, self.record.id, n) for n, item in enumerate(items))
            await self.state.put_conversation(self.owner, conv)

    async def failed(self, message: str) -> None:
        error = {"code": "server_error", "message": message}
        await self.finish({**self.record.response, "status": "failed", "error": error}, link=False)

    async def discard(self) -> None:
        """The record removed: the client got an error, not a response (a failing store is let be)."""
        if self.begun:
            with contextlib.suppress(StateUnavailable):
                await self.state.delete(self.owner, self.record.id)


def new_turn(
    state: ResponsesState, owner: str, req: CreateRequest, chain: list[str], conv: str | None
) -> Turn:
    """A turn with a new id, after the responses ``chain`` (their ids) or in the conversation ``conv``."""
    rid = new_id("resp_")
    echo = Echo(rid, req.model, req.previous_response_id, req.store, req.background, req.conversation)
    status = "queued" if req.background and not req.stream else "in_progress"
    record = Record(
        rid, echo.patch(pending(req, rid, status)), req.input, req.previous_response_id, chain, conv
    )
    return Turn(state, owner, req, echo, record)
