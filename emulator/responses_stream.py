"""The /v1/responses event stream as SGLang 0.5.23 writes it for a non-harmony model (responses-contract
§1.6; `serving_responses.py` `responses_stream_generator_non_harmony` and its inner generator).

Frames are `event: <type>\\ndata: <json>\\n\\n`, each JSON with its `type` and a `sequence_number` counting
from 0, and there is no `[DONE]`. A text answer: `response.created`, `response.in_progress` (status
in_progress, `output: []`, `usage: null`), then with the first visible text `response.output_item.added`
(the message, in_progress, `content: []`), `response.content_part.added` (an empty output_text),
`response.output_text.delta` per engine step that adds text (`logprobs: []`), and once generation ends
`response.output_text.done`, `response.content_part.done`, `response.output_item.done` and the terminal
`response.completed` | `response.incomplete` | `response.failed` carrying the whole response with its
usage. A tool call: `response.output_item.added` (function_call, `arguments: ""`, in_progress), then the
arguments (`response.function_call_arguments.delta` / `.done` with the name; a custom tool's
`response.custom_tool_call_input.delta` / `.done`) and `response.output_item.done`.

When the request has function or custom tools and tool_choice is not "none", every event from the
message's `output_item.added` on is held back until a tool call's item opens or the terminal event comes,
then flushed at once with their sequence numbers (SGLang does this to stamp the message's `phase`).

An engine failure mid-stream ends it as SGLang's abort finish does: the open items close, then
`response.failed` with `error: {"code": "server_error", "message"}`. An error the engine raises before
generating (the context check, SamplingParams.verify) is `response.failed` right after
`response.in_progress`, with `output: []` and `usage: null`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from emulator.replica import Run
from emulator.responses_request import ResponsesCall, ResponsesPlan
from emulator.responses_shapes import (
    CallItem,
    hex_id,
    message_item,
    output_text,
    response_body,
    server_error,
    status_of,
    usage,
)
from emulator.tickets import Emitted, Event, Failed, Finished

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
Finalize = Callable[[dict[str, Any]], None]


def frame(payload: dict[str, Any]) -> bytes:
    kind: str = payload["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class EventWriter:
    """Turns one request's engine events into its frames; `finalize` sees the final response first."""

    def __init__(self, call: ResponsesCall, plan: ResponsesPlan, run: Run | None, finalize: Finalize) -> None:
        self.call, self.plan, self.run, self.finalize = call, plan, run, finalize
        self.seq = 0
        self.pending: list[dict[str, Any]] = []
        self.items: list[dict[str, Any]] = []  # closed items, in wire order
        self.index = -1
        self.sent = 0  # output tokens seen
        self.message: str | None = None  # the open message's id
        self.text = ""
        self.tool = CallItem.of(call, plan.call) if plan.call is not None else None
        self.tool_open = False

    def start(self) -> list[bytes]:
        initial = response_body(self.call, "in_progress", [], None)
        return self._emit(
            self._lifecycle("response.created", initial), self._lifecycle("response.in_progress", initial)
        )

    def rejected(self, message: str) -> list[bytes]:
        """The engine refused the request before generating (a ValueError in SGLang's generator)."""
        failed = response_body(self.call, "failed", [], None, server_error(message))
        return self._emit(self._lifecycle("response.failed", failed))

    def on_event(self, event: Event) -> list[bytes]:
        if isinstance(event, Emitted):
            return self._emit(*self._advance(event.counts[0]))
        if isinstance(event, Finished):
            return self._end(status_of(self.plan.completion.finish), None)
        if isinstance(event, Failed):
            return self._end("failed", server_error(event.message))
        return []

    # ---- generation ---------------------------------------------------------------------------
    def _advance(self, count: int) -> list[dict[str, Any]]:
        comp, before = self.plan.completion, self.sent
        self.sent = max(self.sent, count)
        if self.tool is not None:
            return self._tool_events(count, len(comp.ids))
        delta = comp.text_upto(count)[len(comp.text_upto(before)) :] if count > before else ""
        if not delta:
            return []
        events = [] if self.message is not None else self._open_message()
        self.text += delta
        assert self.message is not None
        return [
            *events,
            self._item_event("response.output_text.delta", content_index=0, delta=delta, logprobs=[]),
        ]

    def _open_message(self) -> list[dict[str, Any]]:
        self.index += 1
        self.message = hex_id("msg_")
        item = message_item(self.message, [], "in_progress")
        added = _event("response.output_item.added", item=item, output_index=self.index)
        part = self._item_event("response.content_part.added", content_index=0, part=output_text(""))
        return [added, part]

    def _tool_events(self, count: int, total: int) -> list[dict[str, Any]]:
        assert self.tool is not None
        events: list[dict[str, Any]] = []
        if count > 0 and not self.tool_open:
            self.tool_open = True
            self.index += 1
            events.append(
                _event("response.output_item.added", item=self.tool.item(done=False), output_index=self.index)
            )
        if count >= total and count > 0:
            kind = "custom_tool_call_input" if self.tool.custom else "function_call_arguments"
            delta = self.tool.payload if self.tool.custom else self.tool.arguments
            events.append(
                _event(
                    f"response.{kind}.delta", delta=delta, item_id=self.tool.item_id, output_index=self.index
                )
            )
        return events

    # ---- the end ------------------------------------------------------------------------------
    def _end(self, status: str, error: dict[str, Any] | None) -> list[bytes]:
        events = self._close_message() + self._close_tool()
        prompt = len(self.plan.job.prompt)
        cached = self.run.cached_tokens if self.run is not None else 0
        final = response_body(self.call, status, self.items, usage(prompt, self.sent, cached), error)
        self.finalize(final)
        return self._emit(*events, self._lifecycle(f"response.{status}", final))

    def _close_message(self) -> list[dict[str, Any]]:
        if self.message is None:
            return []
        part = output_text(self.text)
        item = message_item(self.message, [part])
        self.items.append(item)
        return [
            self._item_event("response.output_text.done", content_index=0, logprobs=[], text=self.text),
            self._item_event("response.content_part.done", content_index=0, part=part),
            _event("response.output_item.done", item=item, output_index=self.index),
        ]

    def _close_tool(self) -> list[dict[str, Any]]:
        if self.tool is None or not self.tool_open:
            return []
        item = self.tool.item()
        self.items.append(item)
        ids = {"item_id": self.tool.item_id, "output_index": self.index}
        if self.tool.custom:
            done = _event("response.custom_tool_call_input.done", input=self.tool.payload, **ids)
        else:
            done = _event(
                "response.function_call_arguments.done",
                arguments=self.tool.arguments,
                name=self.tool.name,
                **ids,
            )
        return [done, _event("response.output_item.done", item=item, output_index=self.index)]

    # ---- framing ------------------------------------------------------------------------------
    def _item_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return _event(kind, item_id=self.message, output_index=self.index, **fields)

    @staticmethod
    def _lifecycle(kind: str, response: dict[str, Any]) -> dict[str, Any]:
        return {"type": kind, "response": response, "sequence_number": -1}

    def _emit(self, *events: dict[str, Any]) -> list[bytes]:
        """Number the events in order, then pass them on or hold them back (the tools buffering)."""
        frames: list[bytes] = []
        for event in events:
            event["sequence_number"] = self.seq
            self.seq += 1
            frames += self._buffered(event)
        return frames

    def _buffered(self, event: dict[str, Any]) -> list[bytes]:
        if not self.call.calls_tools:
            return [frame(event)]
        kind, item_type = event["type"], (event.get("item") or {}).get("type")
        if not self.pending and not (kind == "response.output_item.added" and item_type == "message"):
            return [frame(event)]
        self.pending.append(event)
        tool_follows = kind == "response.output_item.added" and item_type in (
            "function_call",
            "custom_tool_call",
        )
        if not (tool_follows or kind in TERMINAL):
            return []
        for held in self.pending:
            if (held.get("item") or {}).get("type") == "message":
                held["item"]["phase"] = "commentary" if tool_follows else "final_answer"
        frames, self.pending = [frame(e) for e in self.pending], []
        return frames


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    """An item event with its fields in the openai models' (alphabetical) order."""
    return dict(sorted({**fields, "type": kind, "sequence_number": -1}.items()))
