"""The emulator's timing model: modelled seconds for prefill, tier loads and decode.

A replica's time to first token (TTFT) is built from four parts, all in *modelled* seconds (the engine
multiplies them by the time scale before it sleeps):

    TTFT = queue wait
         + host-tier tokens / host_rate + storage-tier tokens / storage_rate
         + prefill cost of the uncached positions [s, e)
         + overhead

Attention makes prefill superlinear in position: computing positions [s, e) costs
``a*(e - s) + b*(e*e - s*s)/2`` (the integral of ``a + b*x``), so a chunk late in a long prompt costs
more than the same number of tokens early on, and the cost of a prompt does not depend on how it is cut
into chunks. Decode emits one token per ``1/decode_rate`` seconds at batch 1, slowed by
``1 + batch_slowdown*(batch - 1)`` when several sequences decode together (HiCache on costs ~3%).

Each profile reproduces one practitioner report (the seeds):

- ``rtx3090x2`` (seed 1): 40K tokens cold 15.4 s, reloaded from host 0.4 s, on GPU 0.1 s.
- ``rx7900xtx2`` (seed 2): 128K tokens cold ~192 s, reloaded from host ~2.65 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Profile:
    """Timing constants of one hardware/model stack."""

    name: str
    a: float  # s per prefill token (linear part)
    b: float  # s per token^2 (attention part)
    host_rate: float  # tokens/s loaded back from the host tier
    storage_rate: float  # tokens/s prefetched from L3 storage
    overhead: float  # s per request (tokenize, schedule, first decode step, detokenize)
    decode_rate: float  # tokens/s at batch 1, HiCache off
    decode_rate_hicache: float  # tokens/s at batch 1, HiCache on
    batch_slowdown: float = 0.08  # per extra sequence in the decode batch


PROFILES: dict[str, Profile] = {
    "rtx3090x2": Profile(
        name="rtx3090x2",
        a=2.5e-4,
        b=6.625e-9,
        host_rate=133_333.0,
        storage_rate=20_000.0,
        overhead=0.1,
        decode_rate=137.0,
        decode_rate_hicache=133.0,
    ),
    "rx7900xtx2": Profile(
        name="rx7900xtx2",
        a=5e-4,
        b=1.5612e-8,
        host_rate=50_200.0,
        storage_rate=10_000.0,
        overhead=0.1,
        decode_rate=40.0,
        decode_rate_hicache=38.8,
    ),
}


class TimingModel(Protocol):
    """What the engine needs to know about time (modelled seconds, before the time scale)."""

    def prefill_seconds(self, start: int, end: int) -> float: ...
    def load_seconds(self, host_tokens: int, storage_tokens: int) -> float: ...
    def overhead_seconds(self) -> float: ...
    def decode_token_seconds(self, batch: int) -> float: ...


@dataclass(frozen=True, slots=True)
class ProfileTiming:
    """The TimingModel of a Profile; `hicache` selects the slower decode rate."""

    profile: Profile
    hicache: bool = False

    def prefill_seconds(self, start: int, end: int) -> float:
        """Cost of computing positions [start, end): a*(e-s) + b*(e^2 - s^2)/2."""
        if end <= start:
            return 0.0
        p = self.profile
        return p.a * (end - start) + p.b * (end * end - start * start) / 2.0

    def load_seconds(self, host_tokens: int, storage_tokens: int) -> float:
        p = self.profile
        return host_tokens / p.host_rate + storage_tokens / p.storage_rate

    def overhead_seconds(self) -> float:
        return self.profile.overhead

    def decode_token_seconds(self, batch: int) -> float:
        p = self.profile
        rate = p.decode_rate_hicache if self.hicache else p.decode_rate
        return (1.0 + p.batch_slowdown * max(0, batch - 1)) / rate


def ttft_seconds(
    timing: TimingModel, prompt_tokens: int, cached_tokens: int, host_tokens: int, storage_tokens: int
) -> float:
    """Modelled TTFT of a request that does not wait: loads + prefill of the uncached tail + overhead.

    `cached_tokens` counts every reused token (GPU hits plus loaded host/storage tokens); at least one
    position is always computed, as SGLang does.
    """
    start = min(cached_tokens, max(0, prompt_tokens - 1))
    return (
        timing.load_seconds(host_tokens, storage_tokens)
        + timing.prefill_seconds(start, prompt_tokens)
        + timing.overhead_seconds()
    )
