"""Generated request bodies over the OpenAI request schema, valid-ish: `body(rng)` is one (path, bytes).

Each body starts as a valid chat or completions request and is then bent: fields get values of random
types (null, booleans, big and negative numbers, NaN-free floats, strings with weird unicode, arrays,
objects), required fields go missing, unknown fields appear, messages get odd roles and content parts.
The engine's work stays small (``WORK_KNOBS``: an integer there is at most 4, else a wrong type) so
that the replicas answer quickly. `is_openai_error` is the check every rejection kvroute makes must pass.
Deterministic for a given ``random.Random``: `tests/proxy/front/test_fuzz.py` draws
the seed from hypothesis, `bench.labs.fuzz` from its ``--seed``.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

MODEL = "emu-model"
PATHS = ("/v1/chat/completions", "/v1/completions")
WEIRD = ("", "\u0000", "\u202e\u200b\ufeff", "\U0001f600" * 3, "é" * 50, "\\ud800", "<|im_end|>", "a" * 2000)
FIELDS = (
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "stream_options",
    "n", "temperature", "top_p", "seed", "stop", "tools", "tool_choice", "response_format", "logprobs",
    "top_logprobs",
    "user", "cache_salt", "extra_key", "lora_path", "rid", "chat_template_kwargs", "echo", "metadata",
)  # fmt: skip


# the engine's work grows with these (tokens, choices, alternatives per token): kept at most 4, so a body
# measures the gateway, not how long an engine takes to write 2**31 logprobs
WORK_KNOBS = ("max_tokens", "max_completion_tokens", "n", "logprobs", "top_logprobs")


def scalar(rng: random.Random) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice((0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63)))
    if kind == 3:
        return rng.choice((0.0, -0.0, 1e-300, 1.5, -1e308, 1e308))
    if kind in (4, 5):
        return rng.choice(WEIRD)
    return rng.choice(("user", "system", "assistant", "tool", "hi", MODEL))


def value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 6)
    if kind < 6:
        return scalar(rng)
    if kind < 8:
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        rng.choice((*FIELDS, "type", "text", "x")): value(rng, depth + 1) for _ in range(rng.randrange(4))
    }


def message(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return value(rng)
    m: dict[str, Any] = {"role": rng.choice(("user", "system", "assistant", "tool")), "content": "hi"}
    if rng.random() < 0.3:
        m["content"] = rng.choice((value(rng), [{"type": "text", "text": rng.choice(WEIRD)}]))
    if rng.random() < 0.1:
        m[rng.choice(("name", "tool_calls", "tool_call_id", "role"))] = value(rng)
    return m


def base(rng: random.Random, path: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(1, 4)}
    if path == PATHS[0]:
        doc["messages"] = [message(rng) for _ in range(rng.randint(1, 4))]
    else:
        doc["prompt"] = rng.choice(("hi", ["a", "b"], [1, 2, 3], [[1, 2]], rng.choice(WEIRD) or "x"))
    doc["stream"] = rng.random() < 0.3
    return doc


def bend(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    for _ in range(rng.randrange(4)):
        op, key = rng.randrange(4), rng.choice(FIELDS)
        if op == 0:
            doc.pop(key, None)
        elif key in ("max_tokens", "max_completion_tokens"):
            doc[key] = rng.choice((rng.randint(0, 4), scalar(rng) if rng.random() < 0.5 else -1))
        else:
            doc[key if op < 3 else f"zz_{key}"] = value(rng)
    for key in WORK_KNOBS:
        if isinstance(doc.get(key), int) and not isinstance(doc[key], bool) and doc[key] > 4:
            doc[key] = 4
    return doc


def body(rng: random.Random) -> tuple[str, bytes]:
    """One generated (path, body); a few are not even JSON objects."""
    path = rng.choice(PATHS)
    if rng.random() < 0.03:
        return path, orjson.dumps(value(rng))
    raw = orjson.dumps(bend(rng, base(rng, path)))
    if rng.random() < 0.03:
        cut = rng.randrange(len(raw))
        raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]
    return path, raw


def is_openai_error(body: bytes) -> bool:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    err = doc.get("error") if isinstance(doc, dict) else None
    return (
        isinstance(err, dict)
        and set(err) >= {"message", "type", "param", "code"}
        and isinstance(err["message"], str)
        and isinstance(err["type"], str)
    )
