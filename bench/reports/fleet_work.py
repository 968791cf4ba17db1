"""What a run cost each replica, from its records and the replicas' own counters: prefill seconds per
replica, and the share of prompt tokens evicted while requests waited."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bench.runs.replay import Record
from bench.systems.fleet import Counters
from emulator.timing import ProfileTiming


def replica_work(
    records: Sequence[Record], counters: Mapping[str, Counters], timing: ProfileTiming
) -> dict[str, float]:
    """Prefill seconds each replica spent in the run, from what the emulators reported:

        work_r = sum over requests served by r of prefill_seconds(c, n)       (usage: n prompt tokens,
                 + host_loaded_r / host_rate + storage_loaded_r / storage_rate  c cached, x-emu-replica)

    with c capped at n - 1 (one position is always computed) and the loads from r's counters (deltas
    over the run). Every replica of `counters` is listed, an idle one with 0."""
    work = {r: timing.load_seconds(c.host_loaded, c.storage_loaded) for r, c in counters.items()}
    for rec in records:
        if rec.ok:
            start = min(rec.cached_tokens, max(0, rec.prompt_tokens - 1))
            work[rec.replica] = work.get(rec.replica, 0.0) + timing.prefill_seconds(start, rec.prompt_tokens)
    return work


def cache_loss(records: Sequence[Record], counters: Mapping[str, Counters]) -> float:
    """sum over requests of (cached at arrival - cached at admission, when positive) / sum prompt tokens
    over the run (NaN without counters or requests): the share of prompt tokens a replica held when the
    request arrived and evicted while it waited in the queue. A cache model that knew every replica's
    cache exactly at the moment it routed (the most the replicas' KV events can tell it) still
    over-predicts by this much unless it forecasts the engine's evictions."""
    prompt = sum(r.prompt_tokens for r in records if r.ok)
    if not counters or not prompt:
        return float("nan")
    return sum(c.lost for c in counters.values()) / prompt
