"""What ``kvroute ab`` and ``kvroute probe`` found: their results, as the reports and plots read them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from diag.client import Generation
from diag.pressure import Plan
from diag.target import Pool, Target
from diag.verdict import Verdict


@dataclass(frozen=True, slots=True)
class Phase:
    name: str  # "cold" or "hot"
    ttfts: tuple[float, ...]
    prompt_tokens: int
    last: Generation

    @property
    def median(self) -> float:
        return statistics.median(self.ttfts)

    @property
    def prefill_rate(self) -> float:
        """Prompt tokens per second of TTFT (median)."""
        return self.prompt_tokens / self.median if self.median > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class AbResult:
    target: Target
    runs: int
    seed: int
    prompt_tokens: int
    cold: Phase
    hot: Phase
    notes: tuple[str, ...]

    @property
    def speedup(self) -> float:
        return self.cold.median / self.hot.median if self.hot.median > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    target: Target
    pool: Pool  # R's replica
    plan: Plan
    seed: int
    token_ids: bool  # prompts sent as input_ids
    r_digest: str
    cold: Generation
    after: Generation
    again: Generation  # the fastest of the step-4 sends
    again_ttfts: tuple[float, ...]
    pressure: dict[str, int]  # replica -> pressure tokens it served
    pressure_contexts: int
    host_used: tuple[int | None, int | None, int | None]  # before step 1, after step 2, at the end
    verdict: Verdict
    context_note: str = ""  # how R's size was chosen when --context-tokens was not given
