"""Sizing the probe's context R and its eviction pressure from a replica's pools (pure).

R: ``--context-tokens`` when given (refused when it cannot fit, ``check_context``); else half the smallest
GPU pool, at most seed 1's 40K and within the input limit (``sized_context``), said in a note.

The probe sends R (r tokens), then unique contexts (pressure, p tokens in all) to R's replica, then R
again. For the re-send to test the host pool, R must have left the GPU but not the host pool:

- out of GPU: the pool's radix cache evicts least recently used first and R is the oldest entry, so R is
  gone once the pressure alone fills the pool: ``p >= gpu`` (``low``);
- still in host: under write_through the host pool holds a copy of everything inserted (R and all the
  pressure) and frees the least recently used copy whose GPU copy is gone (R first) once full, so
  ``r + p <= host``, i.e. ``p <= host - r`` (``high``). write_back only copies on eviction, which needs
  less room (``p <= host + gpu - r``); the stricter bound covers every policy.

Target: the middle of ``[low, high]``, ``p = (low + high) / 2``, when that window is at least 10% wide.
With a narrower window (a small host pool) ``p = 1.05 x low`` and the plan carries a note: R may leave
the host pool too, so only a host hit is conclusive. With HiCache off, ``p = 1.1 x low``.

The pressure is cut into ``k = ceil(p / c)`` contexts of ``ceil(p / k)`` tokens, ``c`` = the context size
asked for (capped by the replica's ``max_req_input_len``); seed 1 used 10-14 contexts of 40K. Through a
gateway, contexts may land on other replicas, so the probe keeps sending until R's replica received
``p`` tokens; each context is then at most ``high - p`` tokens, so the last one cannot push R's replica
past ``high``, and at most ``max_contexts = k x max(2, 2 x replicas)`` are sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diag.client import DiagError
from diag.target import Pool

DEFAULT_CONTEXT_TOKENS = 40_000  # seed 1's context R

NARROW_WINDOW_PCT = 110  # high below this % of low: no room for a middle
NARROW_TARGET_PCT = 105  # pressure, in % of the GPU pool, when the window is narrow
NO_HOST_TARGET_PCT = 110  # pressure, in % of the GPU pool, with HiCache off


def percent(tokens: int, pct: int) -> int:
    """ceil(tokens x pct / 100) in integers (no float rounding)."""
    return -(-tokens * pct // 100)


@dataclass(frozen=True, slots=True)
class Plan:
    target_tokens: int  # pressure R's replica must receive (p)
    context_tokens: int  # tokens per pressure context
    contexts: int  # planned contexts (k)
    max_contexts: int  # bound on contexts sent (a gateway may route some elsewhere)
    low: int  # GPU pool: at least this much pressure pushes R out of the GPU
    high: int | None  # host pool - r: more may push R out of the host pool too (None: HiCache off)
    note: str = ""


def sized_context(pools: tuple[Pool, ...], asked: int | None) -> tuple[int, str]:
    """R's tokens and a note saying how they were chosen: ``asked`` (``--context-tokens``) as given;
    else half the smallest GPU pool, at most ``DEFAULT_CONTEXT_TOKENS`` (seed 1's R) and within every
    replica's input limit, so that R and the pressure fit the pools the probe found."""
    if asked is not None:
        return asked, ""
    gpu = min((p.gpu_tokens for p in pools), default=0)
    if gpu <= 0:
        return DEFAULT_CONTEXT_TOKENS, ""  # check_context says what is missing
    limits = [p.max_input_tokens for p in pools if p.max_input_tokens]
    size = min(DEFAULT_CONTEXT_TOKENS, gpu // 2, *limits)
    if size == DEFAULT_CONTEXT_TOKENS:
        return size, f"R is {size:,} tokens (seed 1's; --context-tokens to choose another)"
    why = f"half the smallest GPU pool ({gpu:,} tokens)" if size == gpu // 2 else "the input limit"
    return size, (
        f"R sized to {size:,} tokens, {why}: seed 1's {DEFAULT_CONTEXT_TOKENS:,} would not fit "
        "(--context-tokens to choose)"
    )


def check_context(pool: Pool, r_tokens: int) -> None:
    """R must fit the replica's input limit and its GPU pool (or the probe means nothing)."""
    if r_tokens <= 0:
        raise DiagError("--context-tokens must be positive")
    if pool.max_input_tokens is not None and r_tokens > pool.max_input_tokens:
        raise DiagError(
            f"--context-tokens {r_tokens:,} exceeds {pool.replica}'s max_req_input_len "
            f"{pool.max_input_tokens:,}"
        )
    if pool.gpu_tokens <= 0:
        raise DiagError(f"{pool.replica} reports no GPU KV pool size")
    if r_tokens >= pool.gpu_tokens:
        raise DiagError(
            f"--context-tokens {r_tokens:,} does not fit {pool.replica}'s GPU pool of "
            f"{pool.gpu_tokens:,} tokens: use a smaller context"
        )


def _target(pool: Pool, low: int, high: int | None) -> tuple[int, str]:
    if high is None:
        return percent(low, NO_HOST_TARGET_PCT), ""
    if high >= percent(low, NARROW_WINDOW_PCT):
        return (low + high) // 2, ""
    note = (
        f"the host pool ({pool.host_tokens:,} tokens) is too small to keep R beside a GPU pool's worth "
        f"of pressure ({low:,} tokens): R may leave the host pool too; only a host hit is conclusive"
    )
    return percent(low, NARROW_TARGET_PCT), note


def plan_pressure(
    pool: Pool, r_tokens: int, context_tokens: int, replicas: int = 1, gateway: bool = False
) -> Plan:
    """The pressure for R's replica ``pool`` (see the module docstring for the formulas)."""
    low = pool.gpu_tokens
    high = pool.host_tokens - r_tokens if pool.hicache else None
    target, note = _target(pool, low, high)
    size = min(context_tokens, pool.max_input_tokens or context_tokens)
    if gateway and high is not None and high > target:
        size = min(size, max(pool.page_size, high - target))
    k = math.ceil(target / max(1, size))
    per = math.ceil(target / k)
    return Plan(target, per, k, k * max(2, 2 * replicas), low, high, note)
