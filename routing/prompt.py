"""The typed prompt: what the proxy parses out of a request body, once, for routing.

The wire format stops at ``proxy/``: ``proxy/front/openai.py`` validates a body and builds a
``PromptRequest``; ``routing.canonical`` renders its ``prompt`` and ``routing.router.Router`` hashes and
estimates it. A prompt is one of

- ``ChatPrompt``: the messages in order, the tool schemas and the chat-template options that change
  what the template renders (``chat_template_kwargs``, ``continue_final_message``, ...);
- ``TextPrompt``: a completions ``prompt`` string or a native ``/generate`` ``text``;
- ``TokenPrompt``: token ids (completions or ``/generate`` ``input_ids``): their count is exact.

A batch of prompts routes by its first one (the batch goes to one replica, and the first prompt's prefix
is the one that can be predicted). Content parts, tool schemas and tool calls stay JSON values
(``JSONValue``): routing renders them canonically and never looks inside.

``Namespace`` holds what decides a request's cache namespace: SGLang's ``cache_salt`` and
``extra_key`` (contract §8), the LoRA adapter, and the gateway tenant (routing.canonical.namespace_salt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSONValue = Any
"""A parsed JSON value (dict, list, str, int, float, bool or None)."""


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: JSONValue = None  # a string, a list of content parts, or None
    name: str | None = None
    tool_calls: JSONValue = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    messages: tuple[Message, ...]
    tools: JSONValue = None
    options: tuple[tuple[str, JSONValue], ...] = ()  # prefix-relevant template options, sorted by name


@dataclass(frozen=True, slots=True)
class TextPrompt:
    text: str


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    ids: tuple[int, ...]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True, slots=True)
class Namespace:
    cache_salt: str = ""
    extra_key: str = ""
    lora: str = ""
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One request as routing receives it (never the raw body)."""

    model: str
    prompt: Prompt | None  # None: nothing to hash (a pass-through request: embeddings, rerank, ...)
    namespace: Namespace = Namespace()
    session: str | None = None  # the conversation key, when the client gave one
    max_new_tokens: int | None = None  # the engine's output budget; None when unbounded or unknown
    size_bytes: int = 0  # the body size, to estimate the tokens of a request without a prompt
