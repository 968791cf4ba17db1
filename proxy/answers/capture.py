"""Capturing the answer a miss relayed, for the response cache (the ``Tap`` of ``proxy.dispatch.forward``).

``Capture`` is handed to ``forward``: it sees the whole body of a non-streamed answer, or every SSE chunk
of a streamed one on its way to the client (the relay itself is unchanged; nothing is delayed). After
``forward`` returns, ``answer()`` is the ``Answer`` to store, or None for anything that is not one
complete, successful choice:
- a status other than 200, a body that is not JSON with exactly one choice (``index`` 0);
- a stream with an error event, without ``[DONE]``, with chunks of several choices;
- a finish reason other than stop, length or tool_calls (an abort, a cut stream);
- relayed bytes beyond ``limit`` (capture stops and keeps nothing).
Events are split on blank lines (``\\n\\n``, or ``\\r\\n\\r\\n``); the ``data:`` lines of an event are
joined. The usage of a stream is the last non-null ``usage`` sent (the usage chunk of
``include_usage``); a stream without one stores an answer without usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from proxy.answers.answer import FINISHED, Answer
from proxy.types import JSONObject

_ENVELOPE = frozenset({"id", "object", "created", "model", "choices", "usage"})
_NOT_STORED = frozenset({"sglext"})  # per-tier cached tokens of the original request, not of a hit


def _loads(data: bytes) -> object:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _one_choice(choices: object) -> JSONObject | None:
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    return choices[0] if choices[0].get("index", 0) == 0 else None


def from_body(chat: bool, body: bytes) -> Answer | None:
    """The Answer of a non-streamed 200 body, or None (see the module docstring)."""
    doc = _loads(body)
    if not isinstance(doc, dict):
        return None
    choice = _one_choice(doc.get("choices"))
    if choice is None or choice.get("finish_reason") not in FINISHED:
        return None
    said = choice.get("message") if chat else choice.get("text")
    if not isinstance(said, dict if chat else str):
        return None
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
    extra = {k: v for k, v in doc.items() if k not in _ENVELOPE and k not in _NOT_STORED}
    return Answer(chat, choice=choice, usage=usage, extra=extra)


class StreamAnswer:
    """Reads relayed SSE bytes; ``answer()`` is the Answer of a complete stream, else None."""

    def __init__(self, chat: bool, limit: int) -> None:
        self.chat, self.limit = chat, limit
        self._buf = b""
        self._size = 0
        self._chunks: list[JSONObject] = []
        self._usage: JSONObject | None = None
        self._done = False
        self._bad = False

    def feed(self, data: bytes) -> None:
        if self._bad or self._done:
            return
        self._size += len(data)
        if self._size > self.limit:
            self._bad, self._buf = True, b""
            return
        events = (self._buf + data).replace(b"\r\n", b"\n").split(b"\n\n")
        self._buf = events.pop()
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines or self._done:
            return
        data = b"\n".join(lines)
        if data == b"[DONE]":
            self._done = True
            return
        doc = _loads(data)
        if not isinstance(doc, dict) or "error" in doc or not isinstance(doc.get("choices"), list):
            self._bad = True
            return
        if isinstance(doc.get("usage"), dict):
            self._usage = doc["usage"]
        if doc["choices"]:
            choice = _one_choice(doc["choices"])
            self._bad = self._bad or choice is None
            self._chunks.extend([choice] if choice is not None else [])

    def answer(self) -> Answer | None:
        if self._bad or not self._done or not self._chunks:
            return None
        finish = [c.get("finish_reason") for c in self._chunks if c.get("finish_reason")]
        if not finish or finish[-1] not in FINISHED:
            return None
        return Answer(self.chat, chunks=tuple(self._chunks), usage=self._usage)


class Capture:
    """The ``forward`` Tap of one cacheable request; ``answer()`` once ``forward`` has returned."""

    def __init__(self, chat: bool, limit: int) -> None:
        self.chat, self.limit = chat, limit
        self._answer: Answer | None = None

    def body(self, status: int, body: bytes) -> None:
        if status == 200 and len(body) <= self.limit:
            self._answer = from_body(self.chat, body)

    async def stream(self, status: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        reader = StreamAnswer(self.chat, self.limit) if status == 200 else None
        async for chunk in chunks:
            if reader is not None:
                reader.feed(chunk)
            yield chunk
        self._answer = reader.answer() if reader is not None else None

    def answer(self) -> Answer | None:
        return self._answer
