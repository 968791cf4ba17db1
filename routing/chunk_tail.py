"""The step a replica will prefill last: a request admitted there finds the others' new prompts missing.

SGLang's scheduler inserts a request's computed prompt into the radix tree after each prefill step
(``cache_unfinished_req`` after every chunk, then at the end of prefill), and with chunked prefill the
step's token budget, ``chunked_prefill_size`` C, is shared (``PrefillAdder``): a request mid-prompt takes
all of it, and the requests queued behind are admitted, and match the tree, in the step of its *last*
chunk while at least a page of budget is left. A request admitted in a step finds none of what that
step's other requests compute in it. (Measured with KV events on rag, 2026-12-03: a repeat question on
an 8K-token document, routed while its first copy was still queued on the same replica, reported 6,144
cached tokens against 8,064 predicted; such repeats were all of that run's cache-model error.)

``Tail`` is the last step of a replica's queue as this gateway routed it: where the prompts of the
requests in it stop being inserted (``cuts``), the budget left in it (``room``) and its predicted
seconds (``last_s``). A request routed to the replica while the tail is *open* joins that step:

    open     = room >= page_size  and  queued prefill s (inflight_prefill_s) > last_s
               (that step has not started: the replica's remaining queued work exceeds its own)
    first    = room if open else C       (the budget of the request's first step; C = inf without chunking)
    uncached = prompt - cached
    fits in first:  it ends in that step: cut = cached, room' = first - uncached,
                    last_s' = prefill_s (+ last_s when open), cuts' = cuts + [cut] (just [cut] when not open)
    otherwise:      before = first + floor((uncached - first - 1) / C) x C; last = uncached - before;
                    its last chunk is a later step, when everything it matched is in the tree:
                    cut = max(cached + before, reach) (reach: its match before this cap),
                    room' = C - last, last_s' = prefill_s x last / uncached, cuts' = [cut]
    room' < page_size:  no tail (the next request starts a step of its own and finds everything)

``limit`` caps what a new request can reuse on the replica at the smallest cut it shares while the tail
is open: the request's block at the cut is the tail's (block hashes chain, so the prefix up to it is
too) and is still provisional there (no KV event has confirmed it, ``routing.ledger``).

A prediction: a step really starts with what the queue left of its budget, and another gateway's
requests are not in this tail. Pure; O(requests in the last step) per replica, at most ``MAX_CUTS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import inf

from routing.types import BlockHash, ReplicaState, RoutingRequest

MAX_CUTS = 8  # cuts kept per tail: the requests sharing one step beyond these are not capped


@dataclass(frozen=True, slots=True)
class Cut:
    """Where one request of the last step stops finding its prompt: block index, its hash, tokens."""

    block: int
    block_hash: BlockHash
    tokens: float


@dataclass(frozen=True, slots=True)
class Tail:
    """The last prefill step of a replica's queue (the module docstring)."""

    cuts: tuple[Cut, ...]
    room: float  # step budget left after its requests, tokens
    last_s: float  # predicted seconds of the step

    def is_open(self, state: ReplicaState) -> bool:
        """Whether a request routed now joins this step."""
        return self.room >= max(1, state.page_size) and state.inflight_prefill_s > self.last_s

    def limit(self, req: RoutingRequest, state: ReplicaState, held: Callable[[BlockHash], bool]) -> float:
        """Tokens ``req`` can reuse on the tail's replica at most (inf when the tail does not cap it)."""
        if not self.is_open(state):
            return inf
        hashes, n = req.block_hashes, len(req.block_hashes)
        shared = (c for c in self.cuts if c.block < n and hashes[c.block] == c.block_hash)
        return min((c.tokens for c in shared if held(c.block_hash)), default=inf)


def next_tail(
    tail: Tail | None, req: RoutingRequest, state: ReplicaState, cached: float, reach: float, prefill_s: float
) -> Tail | None:
    """The tail after ``req`` is routed to ``state``'s replica with ``cached`` tokens reused (``reach``
    before the tail's cap) and ``prefill_s`` predicted; None when the chunk size is not reported or its
    last step leaves no room for another request."""
    chunk, uncached = state.chunk_tokens, req.prompt_tokens - cached
    if chunk == 0 or req.block_tokens <= 0 or uncached <= 0:
        return None
    joins = tail is not None and tail.is_open(state)
    size = chunk if chunk > 0 else inf
    first = tail.room if tail is not None and joins else size
    if uncached <= first:
        ahead = tail if tail is not None and joins else None
        cuts = ahead.cuts[-(MAX_CUTS - 1) :] if ahead else ()
        last_s = prefill_s + (ahead.last_s if ahead else 0.0)
        return _tail(req, cached, cuts, first - uncached, last_s, state)
    before = first + (uncached - first - 1) // size * size
    last = uncached - before
    return _tail(req, max(cached + before, reach), (), size - last, prefill_s * last / uncached, state)


def _tail(
    req: RoutingRequest, cut: float, cuts: tuple[Cut, ...], room: float, last_s: float, state: ReplicaState
) -> Tail | None:
    if room < max(1, state.page_size):
        return None  # the next request waits for the step after: it finds everything
    block, hashes = int(cut // req.block_tokens), req.block_hashes
    own = (Cut(block, hashes[block], block * req.block_tokens),) if block < len(hashes) else ()
    return Tail((*cuts, *own), room, last_s)
