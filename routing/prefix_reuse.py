"""How much of a matched prefix the engine reuses: block runs per tier -> tokens per tier.

``reused_prefix`` turns the leading blocks a replica holds on GPU, then host, then storage into the
tokens SGLang would take from each. Host runs shorter than SGLang's load-back threshold (10 tokens) and
storage runs shorter than its prefetch threshold (256 tokens) count as misses, and the total is capped at
``prompt_tokens - 1`` (the engine always computes one token). On a hybrid replica (``resume_interval`` >
0) a match that stops inside a recorded prompt is first cut back to the last recurrent-state resume point
(``resume_limit``; ``routing.resume``).
"""

from __future__ import annotations

from math import inf

from routing.resume import SequenceEnds, grid_tokens
from routing.types import NO_MATCH, PrefixMatch, ReplicaState, RoutingRequest

LOAD_BACK_MIN_TOKENS = 10  # SGLang skips (recomputes) host loads shorter than this
PREFETCH_MIN_TOKENS = 256  # SGLang prefetches from storage only from this many tokens


def reused_prefix(req: RoutingRequest, g: int, h: int, s: int, resume: float = inf) -> PrefixMatch:
    """Tokens per tier the engine reuses of ``g``, ``h``, ``s`` leading blocks (the module docstring)."""
    if not g and not h and not s:
        return NO_MATCH
    bt = req.block_tokens
    gpu, host, storage = g * bt, h * bt, s * bt
    if resume < gpu + host + storage:  # a hybrid replica resumes only at a resume point
        gpu = min(gpu, resume)
        host = min(host, resume - gpu)
        storage = min(storage, resume - gpu - host)
    if 0 < host < LOAD_BACK_MIN_TOKENS:
        host, storage = 0.0, 0.0
    if storage and storage < PREFETCH_MIN_TOKENS:
        storage = 0.0
    limit = req.prompt_tokens - 1.0
    if gpu + host + storage > limit:  # the engine always computes at least one token
        limit = max(0.0, limit)
        gpu = min(gpu, limit)
        host = min(host, limit - gpu)
        storage = min(storage, limit - gpu - host)
    return PrefixMatch(gpu, host, storage)


def resume_limit(req: RoutingRequest, state: ReplicaState, ends: SequenceEnds, n: int) -> float:
    """Estimated tokens a hybrid replica can resume from when ``n`` leading blocks match (see
    ``routing.resume``); ``inf`` when the match is whole or the replica is not hybrid."""
    interval = state.resume_interval
    if interval <= 0 or n <= 0:
        return inf
    bt = req.block_tokens
    if state.resume_at_end and ends.contained(req.block_hashes[n - 1], req.prompt_tokens, bt):
        return inf
    return grid_tokens(n * bt, interval)
