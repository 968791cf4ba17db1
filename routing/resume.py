"""Resume points of hybrid (GDN/Mamba + attention) replicas: how much of a matched prefix they can reuse.

A hybrid model resumes a cached prefix only where it also holds the recurrent state of that exact
position (contract §3.2): at the end of each prefill chunk (``cache_unfinished_req`` after a chunk), at
the end of each served prompt, and, with ``--mamba-scheduler-strategy extra_buffer``, only at every
``mamba_track_interval`` tokens. A node split inside a sequence has no state, so a prompt that diverges
inside a cached sequence reuses only up to the last resume point before the divergence.

The model, per replica, at block granularity (``ReplicaState.resume_interval`` > 0):

- ``SequenceEnds`` remembers the last block of every recorded prompt and the prompt's length (in blocks
  of the request's own size, so a change of the chars-per-token estimate does not move it).
- A match of ``n`` blocks is **whole** when block ``n - 1`` ends a recorded prompt that the request
  contains: a growing conversation (the previous turn's prompt + output is this prompt's prefix) resumes
  at the previous prompt's end. Otherwise it is cut to the **grid**: the largest multiple of
  ``resume_interval`` engine tokens not beyond the match (``grid_tokens``).
- "Contains" is decided by length. Block hashes stop at the last full block, so a request that matches
  every full block of a recorded prompt either contains its unhashed tail too (a conversation that grew)
  or diverges inside it (another question after the same document: a branch). Only the length tells
  them apart: a request longer than the recorded prompt by more than ``GROWTH_MIN_TOKENS`` is taken to
  contain it, an equally long one is a branch. An exact re-send is then predicted at the grid, short by
  less than one interval: the safe side (it can only make the replica look less attractive).

Chunk boundaries sit on the grid for a prompt prefilled from position 0; one prefilled after a cached
prefix ``c`` has them at ``c + k x interval``. The cache model therefore tolerates a shortfall of up to
one interval on hybrid replicas before it blames capacity (see ``routing.cache_model``).

Memory: one entry per recorded prompt, at most ``capacity`` (the replica's modelled blocks), the least
recently recorded dropped first, in batches (as ``routing.block_lru.BlockLru``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from routing.types import BlockHash

GROWTH_MIN_TOKENS = 1.5
"""A request longer than a recorded prompt by more than this many estimated tokens contains it (the
estimates are rounded to whole tokens; a conversation turn adds at least a role header and separators)."""

_EVICT_BATCH_DIVISOR = 64


class SequenceEnds:
    """The last block of each recorded prompt → the shortest such prompt's length in blocks."""

    __slots__ = ("_ends", "capacity")

    def __init__(self, capacity: int = 0) -> None:
        self._ends: dict[BlockHash, float] = {}
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, hashes: Sequence[BlockHash], prompt_tokens: float, block_tokens: float) -> bool:
        """Records a served prompt; True when its end was not known before (a rollback then forgets it).
        A prompt longer than its hashes (cut at ``max_blocks``) has no hashed end and is not recorded."""
        if not hashes or block_tokens <= 0:
            return False
        length = prompt_tokens / block_tokens
        if length > len(hashes) + 1.5:  # the tail after the last full block is under one block
            return False
        end = hashes[-1]
        ends = self._ends
        known = ends.pop(end, None)
        ends[end] = length if known is None else min(known, length)
        if len(ends) > self.capacity:
            excess = len(ends) - self.capacity + self.capacity // _EVICT_BATCH_DIVISOR
            for block in list(islice(ends, excess)):
                del ends[block]
        return known is None

    def contained(self, end: BlockHash, prompt_tokens: float, block_tokens: float) -> bool:
        """Whether a recorded prompt ends at block ``end`` and a request of ``prompt_tokens`` (that
        matched up to that block) contains it whole (see the module docstring)."""
        length = self._ends.get(end)
        if length is None or block_tokens <= 0:
            return False
        return prompt_tokens - length * block_tokens > GROWTH_MIN_TOKENS

    def discard(self, end: BlockHash) -> None:
        self._ends.pop(end, None)

    def clear(self) -> None:
        self._ends = {}


def grid_tokens(matched_engine_tokens: float, interval: int) -> float:
    """The last resume point at or before ``matched_engine_tokens``: a multiple of ``interval``."""
    if interval <= 0:
        return matched_engine_tokens
    return float(int(matched_engine_tokens // interval) * interval)
