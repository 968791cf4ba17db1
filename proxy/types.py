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
    RESPONSES = "responses"  # /v1/responses (proxy/responses)
    PASSTHROUGH = "passthrough"


ROUTE_PATHS = {Route.CHAT: "/v1/chat/completions", Route.COMPLETIONS: "/v1/completions"}
ROUTE_PATHS[Route.GENERATE] = "/generate"
ROUTE_PATHS[Route.RESPONSES] = "/v1/responses"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request: what relaying needs, and the typed request routing gets (never the body)."""

    route: Route
    model: str | None  # None for /generate and bodies without a model
    stream: bool
    rid: str | None  # a client-supplied SGLang rid, when a string
    routing: PromptRequest
    body: JSONObject = field(default_factory=dict, compare=False, repr=False)  # the parsed body, read-only
    path: str = ""  # the replica path it is sent to; "" for the route's own (``ROUTE_PATHS``)

    @property
    def upstream_path(self) -> str:
        """The path the replica gets: fixed by the route, never the client's spelling of it."""
        return self.path or ROUTE_PATHS[self.route]


@dataclass(frozen=True, slots=True)
class Usage:
    """What the relay read from the replica's ``usage`` (or ``meta_info``) on the way."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
