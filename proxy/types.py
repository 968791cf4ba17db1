"""Type aliases and small values shared by the proxy modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from routing.prompt import PromptRequest

JSONObject = dict[str, Any]


class Route(StrEnum):
    """The request kinds the gateway routes (a metric label)."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    GENERATE = "generate"
    PASSTHROUGH = "passthrough"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request: what relaying needs, and the typed request routing gets (never the body)."""

    route: Route
    model: str | None  # None for /generate and bodies without a model
    stream: bool
    rid: str | None  # a client-supplied SGLang rid, when a string
    routing: PromptRequest
    body: JSONObject = field(default_factory=dict, compare=False, repr=False)  # the parsed body, read-only


@dataclass(frozen=True, slots=True)
class Usage:
    """What the relay read from the replica's ``usage`` (or ``meta_info``) on the way."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
