"""The stored answer of the response cache, and its two faces: a JSON body and an SSE stream.

An ``Answer`` keeps the one choice of a chat or completions response in the form it arrived in:
- ``choice``: ``choices[0]`` of a non-streamed body (``message`` or ``text``, ``logprobs``,
  ``finish_reason``, ``matched_stop``), the body's other top-level fields (``metadata``, ...) in ``extra``;
- or ``chunks``: ``choices[0]`` of every streamed chunk, in order, as SGLang sent them (the chat role
  chunk, content, reasoning and tool-call deltas, the finish chunk);
and ``usage`` when the replica reported it (a stream without ``include_usage`` carries none).

Either form gives both faces (contract §2), so a streamed miss serves a later non-streamed hit and the
other way round:
- the body from chunks: ``content``, ``reasoning_content`` and ``text`` are the concatenated deltas; tool
  calls are merged by ``index`` (first id, type and name; arguments concatenated); logprobs are
  concatenated (chat ``content`` lists, completions' four legacy lists); the finish reason and matched
  stop are the last ones sent;
- the chunks from a body: chat sends the role chunk, the reasoning, the content, each tool call whole in
  one delta, then a finish chunk with an empty delta; completions put ``finish_reason`` on the last text
  chunk. Text is cut per logprob token when the tokens spell it exactly, else per word (whitespace stays
  with the word after it).

A hit gets a new ``id`` and ``created``, the ``model`` its client sent, and the original usage with
``prompt_tokens_details.cached_tokens = prompt_tokens``: no prompt token was computed for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.types import JSONObject

FINISHED = frozenset({"stop", "length", "tool_calls"})
"""Finish reasons of a complete answer; any other (``abort``, ``content_filter``, none) is not stored."""
_EMPTY_DELTA: JSONObject = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
_LEGACY = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
_WORDS = re.compile(r"\s*\S+|\s+")
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Answer:
    """One stored choice (never mutated: faces copy what they change)."""

    chat: bool
    choice: JSONObject | None = None  # the non-streamed choices[0], or None when ``chunks`` hold it
    chunks: tuple[JSONObject, ...] = ()
    usage: JSONObject | None = None
    extra: JSONObject = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {"v": _FORMAT, "chat": self.chat, "choice": self.choice, "chunks": self.chunks}
        return orjson.dumps(doc | {"usage": self.usage, "extra": self.extra})

    @staticmethod
    def from_json(data: bytes) -> Answer | None:
        """The stored answer, or None for bytes this version did not write."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or doc.get("v") != _FORMAT or not isinstance(doc.get("chat"), bool):
            return None
        choice, chunks, usage, extra = (
            doc.get("choice"),
            doc.get("chunks"),
            doc.get("usage"),
            doc.get("extra"),
        )
        if not isinstance(chunks, list) or not all(isinstance(c, dict) for c in chunks):
            return None
        if not (isinstance(choice, dict) or (choice is None and chunks)) or not isinstance(extra, dict):
            return None
        return Answer(doc["chat"], choice, tuple(chunks), usage if isinstance(usage, dict) else None, extra)

    def body_choice(self) -> JSONObject:
        """``choices[0]`` of the non-streamed body."""
        if self.choice is not None:
            return self.choice
        return _chat_choice(self.chunks) if self.chat else _text_choice(self.chunks)

    def stream_choices(self) -> list[JSONObject]:
        """``choices[0]`` of every streamed chunk, in SGLang's order."""
        if self.chunks:
            return list(self.chunks)
        assert self.choice is not None
        return _chat_chunks(self.choice) if self.chat else _text_chunks(self.choice)


def hit_usage(usage: JSONObject | None) -> JSONObject | None:
    """The original counts; every prompt token counts as cached (none was computed for the hit)."""
    if usage is None:
        return None
    out = dict(usage)
    prompt = out.get("prompt_tokens")
    if isinstance(prompt, int):
        details = out.get("prompt_tokens_details")
        out["prompt_tokens_details"] = {
            **(details if isinstance(details, dict) else {}),
            "cached_tokens": prompt,
        }
    return out


def hit_body(a: Answer, rid: str, created: int, model: str) -> bytes:
    head = {"id": rid, "object": "chat.completion" if a.chat else "text_completion", "created": created}
    doc = head | {"model": model, "choices": [a.body_choice()], "usage": hit_usage(a.usage)} | a.extra
    return orjson.dumps(doc)


def hit_stream(a: Answer, rid: str, created: int, model: str, include_usage: bool) -> bytes:
    """The SSE bytes of a hit: every chunk, the usage chunk when asked for, ``[DONE]``."""
    kind = "chat.completion.chunk" if a.chat else "text_completion"
    head: JSONObject = {"id": rid, "object": kind, "created": created, "model": model}
    events = [head | {"choices": [c], "usage": None} for c in a.stream_choices()]
    if include_usage:
        usage = hit_usage(a.usage)
        if not a.chat and usage is not None:  # completions' usage chunk is serialized without nulls
            usage = {k: v for k, v in usage.items() if v is not None}
        events.append(head | {"choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


# ---- the body from the chunks ----------------------------------------------------------------
def _obj(value: Any) -> JSONObject:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _last_finish(chunks: tuple[JSONObject, ...]) -> JSONObject:
    ends = [c for c in chunks if c.get("finish_reason")]
    last = ends[-1] if ends else {}
    return {"finish_reason": last.get("finish_reason"), "matched_stop": last.get("matched_stop")}


def _merge_call(calls: dict[int, JSONObject], delta: Any) -> None:
    """One tool-call delta into the calls by index: first id, type and name; arguments appended."""
    delta = _obj(delta)
    index = delta["index"] if isinstance(delta.get("index"), int) else len(calls)
    call = calls.setdefault(index, {"id": None, "index": index, "type": "function", "function": {}})
    call["id"] = call["id"] or delta.get("id")
    call["type"] = delta.get("type") or call["type"]
    fn, part = call["function"], _obj(delta.get("function"))
    fn["name"] = fn.get("name") or part.get("name")
    fn["arguments"] = fn.get("arguments", "") + _text(part.get("arguments"))


def _chat_choice(chunks: tuple[JSONObject, ...]) -> JSONObject:
    calls: dict[int, JSONObject] = {}
    logprobs: list[Any] = []
    for c in chunks:
        for call in _obj(c.get("delta")).get("tool_calls") or ():
            _merge_call(calls, call)
        entries = _obj(c.get("logprobs")).get("content")
        logprobs.extend(entries if isinstance(entries, list) else ())
    text = "".join(_text(_obj(c.get("delta")).get("content")) for c in chunks)
    reasoning = "".join(_text(_obj(c.get("delta")).get("reasoning_content")) for c in chunks)
    message: JSONObject = {"role": "assistant", "content": text if text or not calls else None}
    message |= {
        "reasoning_content": reasoning or None,
        "tool_calls": [calls[i] for i in sorted(calls)] or None,
    }
    lps = {"content": logprobs} if any(isinstance(c.get("logprobs"), dict) for c in chunks) else None
    return {"index": 0, "message": message, "logprobs": lps} | _last_finish(chunks)


def _text_choice(chunks: tuple[JSONObject, ...]) -> JSONObject:
    text = "".join(_text(c.get("text")) for c in chunks)
    lps = [c["logprobs"] for c in chunks if isinstance(c.get("logprobs"), dict)]
    merged: JSONObject | None = None
    if lps:
        merged = {k: [v for lp in lps if isinstance(lp.get(k), list) for v in lp[k]] for k in _LEGACY}
        if all(lp.get("top_logprobs") is None for lp in lps):
            merged["top_logprobs"] = None
    return {"index": 0, "text": text, "logprobs": merged} | _last_finish(chunks)


# ---- the chunks from the body ----------------------------------------------------------------
def _chunk(fields: JSONObject, logprobs: Any = None, end: JSONObject | None = None) -> JSONObject:
    """One streamed choice; ``end`` holds the finish reason and matched stop of the last one."""
    finish = end or {"finish_reason": None, "matched_stop": None}
    return {"index": 0, **fields, "logprobs": logprobs} | finish


def _delta(**fields: Any) -> JSONObject:
    return {"delta": _EMPTY_DELTA | fields}


def _words(text: str) -> list[str]:
    return _WORDS.findall(text)


def _token_pieces(text: str, entries: Any) -> list[tuple[str, Any]]:
    """Chat content and its logprobs: one piece per token when the tokens spell the text."""
    if not isinstance(entries, list):
        return [(w, None) for w in _words(text)]
    if "".join(_text(_obj(e).get("token")) for e in entries) == text:
        return [(e["token"], {"content": [e]}) for e in entries]
    return [(text, {"content": entries})]


def _chat_chunks(choice: JSONObject) -> list[JSONObject]:
    msg = _obj(choice.get("message"))
    out = [_chunk(_delta(role="assistant", content=""))]
    out += [_chunk(_delta(reasoning_content=w)) for w in _words(_text(msg.get("reasoning_content")))]
    entries = _obj(choice.get("logprobs")).get("content")
    out += [_chunk(_delta(content=t), lp) for t, lp in _token_pieces(_text(msg.get("content")), entries)]
    for i, call in enumerate(msg.get("tool_calls") or ()):
        whole = {**call, "index": call.get("index", i)} if isinstance(call, dict) else call
        out.append(_chunk(_delta(tool_calls=[whole])))
    out.append(_chunk(_delta(), None, _last_finish((choice,))))
    return out


def _legacy_pieces(text: str, lp: Any) -> list[tuple[str, Any]]:
    """Completions text and its legacy logprobs: one piece per token when the tokens spell the text."""
    if not isinstance(lp, dict):
        return [(w, None) for w in _words(text)]
    tokens, lists = lp.get("tokens"), [lp.get(k) for k in _LEGACY]
    if not isinstance(tokens, list) or "".join(map(str, tokens)) != text:
        return [(text, lp)]
    if not all(v is None or (isinstance(v, list) and len(v) == len(tokens)) for v in lists):
        return [(text, lp)]
    per_token = [
        {k: None if v is None else [v[i]] for k, v in zip(_LEGACY, lists, strict=True)}
        for i in range(len(tokens))
    ]
    return list(zip(map(str, tokens), per_token, strict=True))


def _text_chunks(choice: JSONObject) -> list[JSONObject]:
    pieces = _legacy_pieces(_text(choice.get("text")), choice.get("logprobs")) or [("", None)]
    out = [_chunk({"text": t}, lp) for t, lp in pieces[:-1]]
    return [*out, _chunk({"text": pieces[-1][0]}, pieces[-1][1], _last_finish((choice,)))]
