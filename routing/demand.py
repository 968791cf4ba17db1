"""How much demand a shared prefix has: the share of recent requests that start with it (pure).

A prefix is named by the hash of its last block (``prefix_key``): the longest prefix of the request that
some replica holds, which is what the request shares with earlier ones (a RAG document, a system prompt,
a repository). ``DemandBook`` keeps, per key, an exponentially decayed count of the requests that
shared it, decayed per routed request (routing has no clock): after ``half_life`` further requests a
request weighs half. ``share(key)`` is that count over the decayed total, so ``share x`` the fleet's
arrival rate estimates the prefix's own arrival rate (``λ_P``, requests per second) without a clock.

Bounded: at most ``max_keys`` keys; when full, the lightest half is dropped (amortised O(1) per note).
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import BlockHash, Candidate, RoutingRequest

MIN_SHARED_BLOCKS = 2  # a shared prefix shorter than this is not a prefix worth copying


def prefix_key(req: RoutingRequest, cands: Sequence[Candidate]) -> tuple[BlockHash | None, float]:
    """(the key of the longest prefix any candidate holds, its length in tokens); (None, 0) when no
    candidate holds ``MIN_SHARED_BLOCKS`` blocks of it."""
    longest = max((c.match.total_tokens for c in cands), default=0.0)
    blocks = int(longest / max(req.block_tokens, 1e-9) + 1e-6)
    if blocks < MIN_SHARED_BLOCKS or not req.block_hashes:
        return None, 0.0
    return req.block_hashes[min(blocks, len(req.block_hashes)) - 1], longest


class DemandBook:
    """Decayed request counts per shared-prefix key (module docstring)."""

    def __init__(self, half_life: float = 200.0, max_keys: int = 4096) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._max = max_keys
        self._scale = 1.0  # counts are kept in units of the current scale: decay is one multiplication
        self._counts: dict[BlockHash, float] = {}
        self._total = 0.0

    def note(self, key: BlockHash | None) -> None:
        """One more routed request; ``key`` is the prefix it shared (None: none)."""
        self._scale /= self._decay
        if self._scale > 1e12:
            self._rescale()
        self._total += self._scale
        if key is not None:
            self._counts[key] = self._counts.get(key, 0.0) + self._scale
            if len(self._counts) > self._max:
                self._trim()

    def share(self, key: BlockHash | None) -> float:
        """The decayed share of recent requests that shared ``key`` (0 for None or an unknown key)."""
        if key is None or self._total <= 0.0:
            return 0.0
        return self._counts.get(key, 0.0) / self._total

    def _rescale(self) -> None:
        s = self._scale
        self._counts = {k: v / s for k, v in self._counts.items()}
        self._total /= s
        self._scale = 1.0

    def _trim(self) -> None:
        keep = sorted(self._counts.items(), key=lambda kv: kv[1], reverse=True)[: self._max // 2]
        self._counts = dict(keep)
