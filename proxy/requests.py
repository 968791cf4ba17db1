"""Builds the ``RoutingRequest`` of one parsed request: the single place where the proxy turns a body
into what routing sees (block hashes, estimated tokens, session key; never the text itself).

Generation routes are rendered canonically and hashed (``routing.hashing.build_request``) with the
gateway's learned chars-per-token estimate. Pass-through requests (embeddings, rerank, ...) are sized
but not hashed: their prompt is not a generation prefix the replicas cache.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.types import ParsedRequest, Route
from routing.config import RoutingConfig
from routing.hashing import build_request
from routing.types import RoutingRequest

SESSION_HEADER = "x-session-id"
_PATHS = {
    Route.CHAT: "/v1/chat/completions",
    Route.COMPLETIONS: "/v1/completions",
    Route.GENERATE: "/generate",
}


def estimated_prompt_tokens(parsed: ParsedRequest, chars_per_token: float) -> int:
    return parsed.prompt_token_ids + int(parsed.prompt_chars / chars_per_token)


def routing_request(
    parsed: ParsedRequest, headers: Mapping[str, str], cfg: RoutingConfig, chars_per_token: float
) -> RoutingRequest:
    """What the policy and the prefix index see of this request (never its text)."""
    session = headers.get(SESSION_HEADER) or parsed.user
    path = _PATHS.get(parsed.route)
    if path is not None:
        req, _ = build_request(path, parsed.body, cfg, chars_per_token=chars_per_token, session_key=session)
        return req
    return RoutingRequest(
        model=parsed.model or "",
        block_hashes=(),
        prompt_tokens=estimated_prompt_tokens(parsed, chars_per_token),
        block_tokens=cfg.block_chars / chars_per_token,
        session_key=session,
        tenant=parsed.tenant,
        max_new_tokens=parsed.max_new_tokens,
    )
