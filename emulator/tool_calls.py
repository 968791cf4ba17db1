"""The deterministic tool call of chat requests with `tools` (what a --tool-call-parser makes of the
model's `<tool_call>` output).

`tool_target` picks the function: none when no parser is set, no tools are given or tool_choice is
"none"; the named one for `{"type": "function", "function": {"name": ...}}` (400 if absent); the first
tool when tool_choice is "required" or the last message is from the user; otherwise none (after a tool
result the model answers in text). `tool_call` builds one call with arguments drawn from the
function's parameters schema (json_instances.py: schema-valid, seeded per request like the sampler) and
the raw output the parser would have read,
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, tokenized by the emulator's tokenizer
(finish reason "tool_calls").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import xxhash

from emulator.errors import ApiError
from emulator.sampler import Completion, Sampler
from emulator.structured_output import JsonGrammar


def tool_target(body: dict[str, Any], parser: str | None, messages: Sequence[Any]) -> dict[str, Any] | None:
    """The function to call, or None to answer with text."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if not parser or not isinstance(tools, list) or not tools or choice == "none":
        return None
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if not functions:
        return None
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


def tool_call(
    sampler: Sampler, fn: dict[str, Any], prompt: Sequence[int], seed: int | None, choice: int
) -> tuple[dict[str, Any], Completion]:
    """One call to `fn` with arguments drawn from its parameters schema (json_instances.py, with the
    choice's own RNG, so they are schema-valid and deterministic), and the raw model output."""
    name = str(fn.get("name", "tool"))
    params = fn.get("parameters") or {"type": "object"}
    args = JsonGrammar(params).draw(sampler.rng(prompt, seed, choice))
    digest = xxhash.xxh64(f"{name}:{choice}:{len(prompt)}:{prompt[-8:]}".encode()).hexdigest()
    call = {
        "id": f"call_{digest}",
        "index": 0,
        "type": "function",
        "function": {"name": name, "arguments": args},
    }
    raw = f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'
    ids = tuple(sampler.tokenizer.encode(raw))
    pieces = tuple(sampler.tokenizer.token_texts(ids))
    zero = tuple(0.0 for _ in ids)
    top = tuple(((p, 0.0),) for p in pieces)
    return call, Completion(ids, pieces, raw, "tool_calls", None, zero, top)
