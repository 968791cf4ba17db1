"""The probe's verdict from its three timed sends of R (pure).

Evidence, strongest first (the contract's practical note, §3.2: on hybrid models "host-resident" does not
mean "reusable"; the reliable signal is the cached-token report):

1. ``cached_tokens_details.host`` (+ ``storage``) of the re-send after eviction: reuse when it covers at
   least half of R;
2. without per-tier details, ``cached_tokens`` of that re-send: at least half of R;
3. without any cached-token report, time: reuse when the re-send's TTFT <= 0.5 x cold TTFT. Seed 1 saw
   0.026 x (15.4 s -> 0.4 s) with reuse and 1.0 x (15.4 s -> 15.5 s) without, so 0.5 splits them widely.

Outcomes: "HiCache off" (the replica runs without the host tier); "inconclusive" when the experiment did
not test what it should (the gateway re-sent R to another replica, R's replica got less pressure than
its GPU pool, R was still on the GPU, or so much pressure that R may have left the host pool too);
otherwise "host reuse works" or "host reuse broken", the latter naming write_through on a hybrid model
when that is the configuration (seed 1's finding; the fix is ``--hicache-write-policy write_back``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.client import Generation
from diag.pressure import Plan
from diag.target import Pool

WORKS = "host reuse works"
BROKEN = "host reuse broken"
OFF = "HiCache off"
INCONCLUSIVE = "inconclusive"
REUSE_SHARE = 0.5  # of R's tokens, from a tier below the GPU
REUSE_TTFT = 0.5  # x cold TTFT, when no cached-token report exists


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    reason: str
    notes: tuple[str, ...] = ()


def _share(tokens: int | None, r_tokens: int) -> bool:
    return tokens is not None and tokens >= REUSE_SHARE * r_tokens


def host_hit(after: Generation, cold: Generation, r_tokens: int) -> tuple[bool, str]:
    """(reused from below the GPU, the evidence in words)."""
    if after.host is not None:
        below = after.host + (after.storage or 0)
        return _share(below, r_tokens), f"{below:,} of {r_tokens:,} tokens came from host/storage"
    if after.cached_tokens is not None:
        hit = _share(after.cached_tokens, r_tokens)
        return hit, f"{after.cached_tokens:,} of {r_tokens:,} tokens were cached (no per-tier report)"
    ratio = after.ttft_s / cold.ttft_s if cold.ttft_s > 0 else 1.0
    return ratio <= REUSE_TTFT, f"TTFT {ratio:.2f} x cold (no cached-token report)"


def _precondition(plan: Plan, received: int, cold: Generation, after: Generation) -> str:
    """Why the experiment did not test host reuse, or ''."""
    if cold.replica != after.replica:
        return f"the gateway sent the re-send to {after.replica}, not to {cold.replica} which held R"
    if received < plan.low:
        return f"R's replica received {received:,} pressure tokens, less than its GPU pool ({plan.low:,})"
    if _share(after.device, cold.prompt_tokens or 0):
        return f"R was still on the GPU after the pressure ({after.device:,} tokens from the GPU)"
    return ""


def _broken_reason(pool: Pool, evidence: str, ttft_ratio: float) -> str:
    reason = (
        f"R was recomputed after eviction although HiCache is on ({evidence}; TTFT {ttft_ratio:.2f} x cold)"
    )
    if pool.hybrid and (pool.write_policy or "").startswith("write_through"):
        reason += f": {pool.write_policy} on a hybrid model; use --hicache-write-policy write_back"
    return reason


def _again_note(again: Generation, cold: Generation, r_tokens: int) -> tuple[str, ...]:
    fast = (
        _share(again.device, r_tokens)
        if again.device is not None
        else again.ttft_s <= REUSE_TTFT * cold.ttft_s
    )
    return () if fast else ("R sent once more was not a GPU hit either: is the radix cache disabled?",)


def judge(
    pool: Pool, plan: Plan, received: int, cold: Generation, after: Generation, again: Generation
) -> Verdict:
    """The verdict of one probe; ``received`` = pressure tokens R's replica served."""
    r_tokens = cold.prompt_tokens or 0
    notes = _again_note(again, cold, r_tokens)
    ratio = after.ttft_s / cold.ttft_s if cold.ttft_s > 0 else 1.0
    if not pool.hicache:
        return Verdict(
            OFF, f"no host tier on {pool.replica}: R after eviction took {ratio:.2f} x cold TTFT", notes
        )
    skipped = _precondition(plan, received, cold, after)
    if skipped:
        return Verdict(INCONCLUSIVE, skipped, notes)
    hit, evidence = host_hit(after, cold, r_tokens)
    if hit:
        speedup = cold.ttft_s / after.ttft_s if after.ttft_s > 0 else float("inf")
        return Verdict(
            WORKS, f"R came back from the host pool ({evidence}; {speedup:.0f}x faster than cold)", notes
        )
    if plan.high is not None and received > plan.high:
        too_much = (
            f"the pressure ({received:,} tokens) exceeded host pool - R ({plan.high:,}): "
            "R may have left the host pool too"
        )
        return Verdict(INCONCLUSIVE, too_much, notes)
    return Verdict(BROKEN, _broken_reason(pool, evidence, ratio), notes)
