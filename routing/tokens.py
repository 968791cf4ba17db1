"""One token estimator: engine tokens from canonical prompt bytes, learned from what replicas report.

The gateway never tokenizes. A text prompt's engine token count is estimated as
``canonical bytes / bytes_per_token``, and so is the size of a hashed block
(``block_tokens = block_chars / bytes_per_token``). ``bytes_per_token`` starts at
``RoutingConfig.chars_per_token`` and follows every reported ``usage.prompt_tokens`` (a robust running
estimate: a sample is clipped to [0.5x, 2x] of the current value, then ``value += a (sample - value)``
with ``a = max(0.2, 1 / n)`` for the n-th sample, a plain mean of the first five and an EWMA after, then
bounded relative to the start, ``routing.rates.robust_update``). The estimate is a property of the
model's tokenizer and chat template, the same on every replica, so the first reports are trusted fully.
The chat template's own tokens (role headers, separators) are part of what is learned, so the estimate
is of *engine* tokens.

Token-id prompts need no estimate: their count is exact, and so is their block size (they are hashed
per ``RoutingConfig.token_block`` ids, ``routing.hashing.token_block_hashes``); they teach the estimator
nothing.

Gateways that share state pool their estimates (``adopt``): a gateway that starts among others uses
theirs until it has learned from as many reports itself. It is the only place that converts between
bytes and tokens: the cache model keeps capacities in
engine tokens and converts them to blocks with ``block_tokens()`` when it sizes its tiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.rates import ALPHA, robust_update

MIN_SAMPLE_TOKENS = 16  # shorter prompts are dominated by template overhead: not learned from


@dataclass(frozen=True, slots=True)
class Estimate:
    prompt_tokens: int  # engine tokens of the prompt
    block_tokens: float  # engine tokens per full block
    exact: bool = False  # a token-id prompt: nothing to learn from its report


class TokenEstimator:
    """Bytes of canonical prompt per engine token (see the module docstring)."""

    def __init__(self, start: float, block_chars: int) -> None:
        self._start = start
        self._block_chars = block_chars
        self.bytes_per_token = start
        self.samples = 0

    def block_tokens(self) -> float:
        return self._block_chars / self.bytes_per_token

    def text(self, size_bytes: int) -> Estimate:
        """The estimate for a text prompt (or a body without a prompt) of ``size_bytes`` bytes."""
        return Estimate(max(1, round(size_bytes / self.bytes_per_token)), self.block_tokens())

    def ids(self, count: int, block_tokens: int) -> Estimate:
        """A token-id prompt of ``count`` ids, hashed in blocks of ``block_tokens`` ids: both exact."""
        return Estimate(max(1, count), float(block_tokens), exact=True)

    def adopt(self, peers: Sequence[tuple[float, int]]) -> bool:
        """Other gateways' estimates, ``(bytes_per_token, samples)`` each: while this one has learned
        from fewer reports than the best of them (a gateway that just started), it takes the
        sample-weighted mean of all, its own included. True when the value moved."""
        best = max((n for _, n in peers), default=0)
        if best <= self.samples:
            return False
        total = self.samples + sum(n for _, n in peers)
        pooled = (self.bytes_per_token * self.samples + sum(v * n for v, n in peers)) / total
        moved = pooled != self.bytes_per_token
        self.bytes_per_token = pooled
        return moved

    def observe(self, size_bytes: int, reported_tokens: int | None) -> None:
        """One text prompt's canonical size against the ``usage.prompt_tokens`` its replica reported."""
        if not reported_tokens or reported_tokens < MIN_SAMPLE_TOKENS or size_bytes <= 0:
            return
        self.samples += 1
        alpha = max(ALPHA, 1.0 / self.samples)
        sample = size_bytes / reported_tokens
        self.bytes_per_token = robust_update(self.bytes_per_token, sample, self._start, alpha)
