"""Helpers of the response-cache tests: requests with JSON bodies, SSE parsing, chunk kinds."""

from __future__ import annotations

from typing import Any

import orjson

from tests.proxy.conftest import MODEL, post

CHAT_PATH, TEXT_PATH = "/v1/chat/completions", "/v1/completions"
JSON = {"Content-Type": "application/json"}
VOLATILE = ("id", "created")


def chat(text: str, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0}
    return body | {"max_tokens": 12} | fields


def completion(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": text, "temperature": 0, "max_tokens": 12} | fields


async def ask(
    url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body bytes, lower-cased headers) of one POST of ``body`` as JSON."""
    return await post(url, path, orjson.dumps(body), JSON | (headers or {}))


def events(raw: bytes) -> list[Any]:
    """The SSE data of a stream, in order: parsed chunks, and the string "[DONE]"."""
    out: list[Any] = []
    for event in raw.decode().split("\n\n"):
        if event.startswith("data: "):
            data = event[len("data: ") :]
            out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def stable(doc: Any) -> Any:
    """A chunk or body without what differs between two answers (id, created)."""
    return {k: v for k, v in doc.items() if k not in VOLATILE} if isinstance(doc, dict) else doc


def kind(e: Any) -> str:
    """role | content | reasoning | tool | text | finish | usage | DONE: what one chunk carries."""
    if e == "[DONE]":
        return "DONE"
    if not e["choices"]:
        return "usage"
    choice = e["choices"][0]
    delta = choice.get("delta")
    if delta is None:
        return "finish" if choice["finish_reason"] else "text"
    if delta.get("role"):
        return "role"
    for field, name in (("content", "content"), ("reasoning_content", "reasoning"), ("tool_calls", "tool")):
        if delta.get(field):
            return name
    return "finish" if choice["finish_reason"] else "empty"


def kinds(evs: list[Any]) -> list[str]:
    """The chunk kinds in order, runs of one kind counted once (chunkings of one text compare equal)."""
    out: list[str] = []
    for k in map(kind, evs):
        if not out or out[-1] != k:
            out.append(k)
    return out


def streamed_text(evs: list[Any]) -> str:
    """The content (chat) or text (completions) of a stream."""
    parts = []
    for e in evs:
        for c in e["choices"] if isinstance(e, dict) else ():
            parts.append((c.get("delta") or {}).get("content") or c.get("text") or "")
    return "".join(parts)


def usage_of(evs: list[Any]) -> dict[str, Any] | None:
    found = [e["usage"] for e in evs if isinstance(e, dict) and e.get("usage")]
    return found[-1] if found else None


def counts(usage: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    assert usage is not None
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
