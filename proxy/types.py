"""Type aliases and small values shared by the proxy modules."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

JSONObject = dict[str, Any]


class Route(StrEnum):
    """The request kinds the gateway routes (a metric label)."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    GENERATE = "generate"
    PASSTHROUGH = "passthrough"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated generation request: what routing and relaying need, never the prompt text."""

    route: Route
    model: str | None  # None for /generate and bodies without a model
    stream: bool
    prompt_chars: int  # characters of prompt text (or tokens x chars-per-token for token-id prompts)
    prompt_token_ids: int  # prompt tokens given as ids (exact), 0 for text prompts
    max_new_tokens: int
    user: str | None
    tenant: str  # cache_salt + extra_key (SGLang's extra_key_effective)
    rid: str | None  # a client-supplied SGLang rid, when a string
    body: JSONObject


@dataclass(frozen=True, slots=True)
class Usage:
    """What the relay read from the replica's ``usage`` (or ``meta_info``) on the way."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
