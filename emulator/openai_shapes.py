"""JSON shapes of SGLang's OpenAI routes (contract §2), and the deterministic tool call.

Non-stream bodies: `chat.completion` / `text_completion` with `choices`, `usage` (prompt tokens counted
once per prompt, completion tokens summed over choices, `prompt_tokens_details` only with
--enable-cache-report and null when 0), `metadata.weight_version`, and `sglext.cached_tokens_details`
when the request asked `return_cached_tokens_details`.

Stream chunks (ChunkWriter turns engine events into chunks): chat sends a role chunk per choice, content
(or tool-call) deltas, then after generation one finish chunk per choice with an empty delta; completions
put `finish_reason` on the last content chunk; both end with an optional usage chunk (`choices: []`) and
`[DONE]`. Ordinary chunks carry `usage: null` unless `continuous_usage_stats`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import xxhash

from emulator.errors import ApiError
from emulator.sampler import Completion
from emulator.tickets import Emitted, Event, Failed, Finished
from emulator.tokenizer import PseudoTokenizer

if TYPE_CHECKING:
    from emulator.openai_api import Plan
    from emulator.replica import Job, Run

WEIGHT_VERSION = "default"
_EMPTY_DELTA = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}


def now() -> int:
    return int(time.time())


# ---- tool calls -----------------------------------------------------------------------------
def tool_target(body: dict[str, Any], parser: str | None, messages: Sequence[Any]) -> dict[str, Any] | None:
    """The function to call, or None to answer with text."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if not parser or not isinstance(tools, list) or not tools or choice == "none":
        return None
    functions = [t.get("function", {}) for t in tools if isinstance(t, dict)]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for fn in functions:
            if fn.get("name") == name:
                return dict(fn)
        raise ApiError(f"Tool '{name}' not found in 'tools'.")
    last = messages[-1] if messages else {}
    if choice == "required" or (isinstance(last, dict) and last.get("role") == "user"):
        return dict(functions[0])
    return None


def _value(name: str, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and schema.get("enum"):
        return schema["enum"][0]
    if kind == "integer":
        return 1 + xxhash.xxh32_intdigest(name.encode()) % 100
    if kind == "number":
        return round(1.5 + xxhash.xxh32_intdigest(name.encode()) % 100, 1)
    if kind == "boolean":
        return True
    if kind == "array":
        return [_value(name, schema.get("items", {}))] if schema.get("items") else []
    if kind == "object":
        return _arguments(schema)
    return f"{name}-{xxhash.xxh32_hexdigest(name.encode())[:6]}"


def _arguments(schema: Any) -> dict[str, Any]:
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return {key: _value(key, sub) for key, sub in sorted(props.items())}


def tool_call(
    tokenizer: PseudoTokenizer, fn: dict[str, Any], prompt: Sequence[int], choice: int
) -> tuple[dict[str, Any], Completion]:
    """One call to `fn` with arguments built from its parameters schema, and its raw model output."""
    name = str(fn.get("name", "tool"))
    args = json.dumps(_arguments(fn.get("parameters", {})), ensure_ascii=False)
    digest = xxhash.xxh64(f"{name}:{choice}:{len(prompt)}:{prompt[-8:]}".encode()).hexdigest()
    call = {
        "id": f"call_{digest}",
        "index": 0,
        "type": "function",
        "function": {"name": name, "arguments": args},
    }
    raw = f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    ids = tuple(tokenizer.encode(raw))
    pieces = tuple(tokenizer.decode([i]) for i in ids)
    zero = tuple(0.0 for _ in ids)
    top = tuple(((p, 0.0),) for p in pieces)
    return call, Completion(ids, pieces, raw, "tool_calls", None, zero, top)


# ---- usage and logprobs ---------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached: int, report: bool) -> dict[str, Any]:
    details = {"cached_tokens": cached} if report and cached > 0 else None
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
    }


def chat_logprobs(comp: Completion, start: int, end: int) -> dict[str, Any]:
    def entry(token: str, lp: float) -> dict[str, Any]:
        return {"token": token, "bytes": list(token.encode()), "logprob": lp}

    content = [
        {**entry(comp.pieces[i], comp.logprobs[i]), "top_logprobs": [entry(t, lp) for t, lp in comp.top[i]]}
        for i in range(start, end)
    ]
    return {"content": content}


def legacy_logprobs(comp: Completion, start: int, end: int, offset: int) -> dict[str, Any]:
    offsets, pos = [], offset
    for i in range(start, end):
        offsets.append(pos)
        pos += len(comp.pieces[i])
    return {
        "text_offset": offsets,
        "token_logprobs": list(comp.logprobs[start:end]),
        "tokens": list(comp.pieces[start:end]),
        "top_logprobs": [dict(comp.top[i]) for i in range(start, end)] if comp.top and comp.top[0] else None,
    }


def _cached(run: Run) -> int:
    return run.prefilled.cached_tokens if run.prefilled is not None else 0


def _sglext(run: Run) -> dict[str, Any]:
    pre = run.prefilled
    if pre is None:
        return {}
    details: dict[str, Any] = {"device": pre.device, "host": pre.host}
    if run.replica.cfg.hicache_storage_backend:
        details |= {"storage": pre.storage, "storage_backend": "HiCacheFile"}
    return {"cached_tokens_details": details}


# ---- non-stream bodies ----------------------------------------------------------------------
def full_body(plan: Plan, job: Job, run: Run, report: bool) -> dict[str, Any]:
    comps = plan.completions
    choices = [
        _chat_choice(plan, i, c) if plan.chat else _text_choice(plan, i, c) for i, c in enumerate(comps)
    ]
    out_tokens = sum(len(c.ids) for c in comps)
    body: dict[str, Any] = {
        "id": job.rid,
        "object": "chat.completion" if plan.chat else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": usage(len(job.prompt), out_tokens, _cached(run), report),
        "metadata": {"weight_version": WEIGHT_VERSION},
    }
    if plan.cache_details and (ext := _sglext(run)):
        body["sglext"] = ext
    return body


def _chat_choice(plan: Plan, i: int, comp: Completion) -> dict[str, Any]:
    call = plan.tool_calls[i]
    message = {
        "role": "assistant",
        "content": None if call else comp.text,
        "reasoning_content": None,
        "tool_calls": [call] if call else None,
    }
    return {
        "index": i,
        "message": message,
        "logprobs": chat_logprobs(comp, 0, len(comp.ids)) if plan.logprobs else None,
        "finish_reason": comp.finish,
        "matched_stop": comp.matched,
    }


def _text_choice(plan: Plan, i: int, comp: Completion) -> dict[str, Any]:
    prefix = plan.echo or ""
    lps = legacy_logprobs(comp, 0, len(comp.ids), len(prefix)) if plan.logprobs else None
    return {
        "index": i,
        "text": prefix + comp.text,
        "logprobs": lps,
        "finish_reason": comp.finish,
        "matched_stop": comp.matched,
    }


# ---- streams --------------------------------------------------------------------------------
class ChunkWriter:
    """Turns engine events into the chunk dicts of one stream."""

    def __init__(self, plan: Plan, run: Run, report: bool) -> None:
        self.plan = plan
        self.run = run
        self.report = report
        self.sent = [0] * len(plan.completions)
        self.started = [False] * len(plan.completions)

    def on_event(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, Emitted):
            return [c for i, n in enumerate(event.counts) for c in self._advance(i, n)]
        if isinstance(event, Finished):
            chunks = [
                self._chunk(i, _EMPTY_DELTA, c.finish, c.matched) for i, c in enumerate(self.plan.completions)
            ]
            chunks = chunks if self.plan.chat else []
            if self.plan.include_usage:
                chunks.append(self._usage_chunk())
            return chunks
        if isinstance(event, Failed):
            err = {"object": "error", "message": event.message, "type": "InternalServerError"}
            return [{"error": err | {"param": None, "code": event.status}}]
        return []

    def _advance(self, i: int, count: int) -> list[dict[str, Any]]:
        comp, before = self.plan.completions[i], self.sent[i]
        chunks: list[dict[str, Any]] = []
        if self.plan.chat and not self.started[i]:
            self.started[i] = True
            role = {**_EMPTY_DELTA, "role": "assistant", "content": ""}
            chunks.append(self._chunk(i, role, None, None))
        if count <= before:
            return chunks
        self.sent[i] = count
        text = comp.text_upto(count)[len(comp.text_upto(before)) :]
        done = count >= len(comp.ids)
        if self.plan.chat:
            chunks += self._chat_delta(i, comp, text, before, count, done)
        elif text or done:
            lps = legacy_logprobs(comp, before, count, 0) if self.plan.logprobs else None
            finish = comp.finish if done else None
            chunks.append(
                self._chunk(i, None, finish, comp.matched if done else None, text=text, logprobs=lps)
            )
        return chunks

    def _chat_delta(
        self, i: int, comp: Completion, text: str, before: int, count: int, done: bool
    ) -> list[dict[str, Any]]:
        call = self.plan.tool_calls[i]
        if call is not None:
            fn = call["function"]
            if before == 0:
                head = {
                    **call,
                    "function": {"name": fn["name"], "arguments": fn["arguments"] if done else ""},
                }
                return [self._chunk(i, {**_EMPTY_DELTA, "tool_calls": [head]}, None, None)]
            if done:
                tail = {
                    "id": None,
                    "index": 0,
                    "type": None,
                    "function": {"name": None, "arguments": fn["arguments"]},
                }
                return [self._chunk(i, {**_EMPTY_DELTA, "tool_calls": [tail]}, None, None)]
            return []
        if not text:
            return []
        lps = chat_logprobs(comp, before, count) if self.plan.logprobs else None
        return [self._chunk(i, {**_EMPTY_DELTA, "content": text}, None, None, logprobs=lps)]

    def _chunk(
        self,
        i: int,
        delta: dict[str, Any] | None,
        finish: str | None,
        matched: str | int | None,
        text: str = "",
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": i}
        if self.plan.chat:
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice |= {"logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        chunk = self._envelope()
        chunk["choices"] = [choice]
        chunk["usage"] = self._usage() if self.plan.continuous_usage else None
        return chunk

    def _envelope(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.plan.chat else "text_completion"
        return {
            "id": self.run.ticket.work.rid,
            "object": obj,
            "created": self.plan.created,
            "model": self.plan.model,
        }

    def _usage(self) -> dict[str, Any]:
        prompt = len(self.run.ticket.work.prompt)
        return usage(prompt, sum(self.sent), _cached(self.run), self.report)

    def _usage_chunk(self) -> dict[str, Any]:
        chunk = self._envelope() | {"choices": [], "usage": self._usage()}
        if not self.plan.chat and chunk["usage"]["prompt_tokens_details"] is None:
            del chunk["usage"]["prompt_tokens_details"]  # completions: exclude_none
        return chunk
