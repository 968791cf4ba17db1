"""Builds the ``RoutingRequest`` of one parsed request: the single place where the proxy turns a body
into what routing sees.

Today the prompt is measured, not hashed (``block_hashes=()``): prefix-blind policies need only the
estimated prompt tokens, the session key and the tenant. When ``routing.hashing`` lands, this function
is where the canonical prompt is rendered and hashed; nothing else in the proxy changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.types import ParsedRequest
from routing.config import RoutingConfig
from routing.types import RoutingRequest

SESSION_HEADER = "x-session-id"


def estimated_prompt_tokens(parsed: ParsedRequest, cfg: RoutingConfig) -> int:
    return parsed.prompt_token_ids + int(parsed.prompt_chars / cfg.chars_per_token)


def routing_request(parsed: ParsedRequest, headers: Mapping[str, str], cfg: RoutingConfig) -> RoutingRequest:
    """What the policy and the prefix index see of this request (never its text)."""
    return RoutingRequest(
        model=parsed.model or "",
        block_hashes=(),
        prompt_tokens=estimated_prompt_tokens(parsed, cfg),
        block_tokens=cfg.block_chars / cfg.chars_per_token,
        session_key=headers.get(SESSION_HEADER) or parsed.user,
        tenant=parsed.tenant,
        max_new_tokens=parsed.max_new_tokens,
    )
