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

Profiles (``--emu-profile``):

- ``rtx3090x2`` (seed 1): 40K tokens cold 15.4 s, reloaded from host 0.4 s, on GPU 0.1 s.
- ``rx7900xtx2`` (seed 2): 128K tokens cold ~192 s, reloaded from host ~2.65 s.
- ``h200`` (datacenter): a dense 32B model in bf16 on one H200, measured with HF transformers; its
  derivation is in ``h200_profile``. Policies are checked on it too, so they are not tuned to one GPU.

Two prefill measurements (n1, r1), (n2, r2), as average rates over whole cold prompts, fix the model:
``n/r = a*n + b*n^2/2`` at both points is a 2x2 linear system (``fit_prefill``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DEFAULT_GPU_KV_TOKENS = 233_207  # seed 1's KV pool with HiCache off (159,692 with it on, see config.py)
DEFAULT_KV_BYTES_PER_TOKEN = 16_384


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
    gpu_kv_tokens: int = DEFAULT_GPU_KV_TOKENS  # GPU KV pool with HiCache off (--emu-gpu-kv-tokens)
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN  # (--emu-kv-bytes-per-token)


def fit_prefill(n1: int, rate1: float, n2: int, rate2: float) -> tuple[float, float]:
    """(a, b) such that a cold prompt of n_i tokens prefills in n_i / rate_i seconds:
    a*n + b*n^2/2 = n/r at both points, i.e. a + b*n/2 = 1/r, so b = 2*(1/r2 - 1/r1)/(n2 - n1) and
    a = 1/r1 - b*n1/2."""
    b = 2.0 * (1.0 / rate2 - 1.0 / rate1) / (n2 - n1)
    return 1.0 / rate1 - b * n1 / 2.0, b


def h200_profile() -> Profile:
    """A dense 32B transformer (bf16) on one H200 (141 GB), HF transformers: a lower bound for an engine.

    Measured (the issue's figures): cold prefill at 7.0K tokens/s over an 8K-token prompt and 5.2K
    tokens/s over a 40K-token one (8,000 and 40,000 tokens; average rates of the prefill pass); a
    64-token question on 40K tokens already on GPU: 0.26 s TTFT; KV 256 KiB per token; a pinned host to
    GPU copy at 55 GB/s.

    Derived: a, b from the two rates (``fit_prefill``); overhead = 0.26 s minus the prefill of positions
    [40,000, 40,064) (the question attends to the whole cached context), ~0.244 s: what HF
    transformers spends around a forward pass (tokenize, first decode step, detokenize), large next to
    an engine's; host_rate = 55e9 / 262,144 bytes = ~209.8K tokens/s. GPU KV pool: SGLang's default
    --mem-fraction-static 0.88 of 141e9 bytes is 124.1 GB, minus 64e9 bytes of bf16 weights leaves
    60.1 GB = 229,187 tokens of 256 KiB (HiCache takes its ~31.5% of that, config.py).

    Chosen, not measured: decode at 40 tokens/s at batch 1 (the bandwidth roofline is 4.8 TB/s / 64 GB =
    75 steps/s; HF transformers without CUDA graphs reaches about half of it), 3% slower with HiCache
    on (the seeds' figure); L3 storage prefetch at 5 GB/s (a local NVMe read), ~19K tokens/s.
    """
    kv_bytes = 256 * 1024
    a, b = fit_prefill(8_000, 7_000.0, 40_000, 5_200.0)
    question = a * 64 + b * (40_064**2 - 40_000**2) / 2.0
    return Profile(
        name="h200",
        a=a,
        b=b,
        host_rate=55e9 / kv_bytes,
        storage_rate=5e9 / kv_bytes,
        overhead=0.26 - question,
        decode_rate=40.0,
        decode_rate_hicache=40.0 * 0.97,
        gpu_kv_tokens=int((0.88 * 141e9 - 64e9) // kv_bytes),
        kv_bytes_per_token=kv_bytes,
    )


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
    "h200": h200_profile(),
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
