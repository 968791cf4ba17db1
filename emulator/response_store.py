"""A replica's in-memory Responses store (`--enable-response-store`; responses-contract §1.5, §1.7).

As SGLang 0.5.23's `OpenAIServingResponses` keeps it, in its one process: `responses` (id → the response
object, here its JSON body), `histories` (SGLang's `msg_store`: id → the whole flattened chain of input
items, earlier outputs included, instructions excluded) and `tasks` (the background generations). No
TTL, no size limit, nothing survives a restart (`clear`, called by Replica.restart).

- `begin(id, history)`: a `store: true` request records its history when it starts (before generating);
- `put(id, response)`: a background response is stored `queued` at once and updated in place;
- `finish(id, response, output)`: on completion the response is stored and the history grows by its
  output items (`model_dump(exclude_none=True)`), unless the stored one was cancelled meanwhile;
- `chain(id)`: the history a `previous_response_id` continues, or None when no response is stored under
  it (a non-background response is stored only when it completes);
- `cancel(id)`: a `queued` / `in_progress` response becomes `cancelled` and its task is cancelled
  (which aborts its engine request); a terminal one is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

IN_FLIGHT = ("queued", "in_progress")


def without_none(value: Any) -> Any:
    """A JSON value with None-valued object keys dropped, recursively (pydantic's exclude_none)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


@dataclass(eq=False, slots=True)
class ResponseStore:
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, list[Any]] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def begin(self, response_id: str, history: Sequence[Any]) -> None:
        self.histories[response_id] = list(history)

    def put(self, response_id: str, response: dict[str, Any]) -> None:
        self.responses[response_id] = response

    def get(self, response_id: str) -> dict[str, Any] | None:
        return self.responses.get(response_id)

    def chain(self, response_id: str) -> list[Any] | None:
        if response_id not in self.responses:
            return None
        return list(self.histories.get(response_id, []))

    def finish(self, response_id: str, response: dict[str, Any], history: Sequence[Any]) -> None:
        """Store a finished response and its chain, unless it was cancelled meanwhile."""
        stored = self.responses.get(response_id)
        if stored is not None and stored.get("status") == "cancelled":
            return
        self.responses[response_id] = response
        self.histories[response_id] = [*history, *(without_none(item) for item in response["output"])]

    def set_status(self, response_id: str, status: str) -> None:
        stored = self.responses.get(response_id)
        if stored is not None:
            stored["status"] = status

    def track(self, response_id: str, task: asyncio.Task[None]) -> None:
        self.tasks[response_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(response_id, None))

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """The stored response after a cancel (None if absent); an in-flight one is cancelled."""
        stored = self.responses.get(response_id)
        if stored is None or stored.get("status") not in IN_FLIGHT:
            return stored
        stored["status"] = "cancelled"
        task = self.tasks.get(response_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return stored

    def clear(self) -> None:
        """Lose everything (a restart): cancel the background generations, forget every response. A
        cancelled task stores nothing: its CancelledError comes before any further event."""
        for task in list(self.tasks.values()):
            task.cancel()
        self.responses.clear()
        self.histories.clear()
        self.tasks.clear()
