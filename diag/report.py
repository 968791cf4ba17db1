"""Text and JSON reports of ``kvroute probe`` and ``kvroute ab`` (pure; prompts appear as digests only).

The probe's table lists the three timed sends of R with each TTFT as a ratio to the cold one, beside
seed 1's write_back ratios (15.4 : 0.4 : 0.1 s = 1 : 0.026 : 0.0065), so a run on any hardware or an
emulator with a time scale compares directly. The A/B table gives, per URL and phase, the median TTFT
(with min-max over runs), prefill throughput = prompt tokens / TTFT (for the hot phase an equivalent
rate, as seed 2 notes: most of the prompt was not recomputed) and the cached-token report.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from diag.client import Generation
from diag.metrics import HOST_USED

if TYPE_CHECKING:
    from diag.results import AbResult, Phase, ProbeResult

SEED_RATIOS = (1.0, 0.4 / 15.4, 0.1 / 15.4)  # seed 1, write_back: cold, after eviction, again


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _row(name: str, g: Generation, cold: float, seed: float, gateway: bool) -> str:
    ratio = g.ttft_s / cold if cold > 0 else float("nan")
    cells = f"  {name:<22} {g.ttft_s:>9.3f} {ratio:>8.4f} {seed:>8.4f} {_count(g.cached_tokens):>9}"
    cells += f" {_count(g.device):>9} {_count(g.host):>9}"
    return cells + (f"  {g.replica or '-'}" if gateway else "")


def _host_line(host: tuple[int | None, int | None, int | None]) -> str:
    if all(v is None for v in host):
        return f"  host pool used: not exposed (no {HOST_USED}; SGLang needs --enable-metrics)"
    before, middle, end = (_count(v) for v in host)
    return (
        f"  host pool used ({HOST_USED}): {before} before -> {middle} after the pressure -> {end} at the end"
    )


def _plan_lines(r: ProbeResult) -> list[str]:
    p = r.plan
    high = f"host pool - R {p.high:,}" if p.high is not None else "no host pool"
    lines = [
        f"  pressure: {r.pressure_contexts} unique contexts of {p.context_tokens:,} tokens; target "
        f"{p.target_tokens:,} tokens on R's replica (GPU pool {p.low:,} <= pressure <= {high})"
    ]
    if r.target.gateway and r.cold.replica is None:
        lines.append(
            "  note: the gateway names no replica (no x-kvroute-replica header: --no-request-id-headers?); "
            "the pressure is counted as if it all reached R's replica"
        )
    elif r.target.gateway:
        served = ", ".join(f"{k} {v:,}" for k, v in sorted(r.pressure.items()))
        lines.append(f"  pressure served per replica: {served}")
    return lines + ([f"  note: {p.note}"] if p.note else [])


def probe_text(r: ProbeResult) -> str:
    prompt = "token ids" if r.token_ids else "text"
    lines = [
        f"kvroute probe: {r.target.describe()}",
        *([f"  R's replica: {r.pool.replica}"] if r.target.gateway else []),
        f"  R: {r.cold.prompt_tokens or 0:,} tokens sent as {prompt} (prompt {r.r_digest}, seed {r.seed})",
        *([f"  note: {r.context_note}"] if r.context_note else []),
        *_plan_lines(r),
        "",
        f"  {'step':<22} {'TTFT s':>9} {'x cold':>8} {'seed 1':>8} {'cached':>9} {'device':>9} {'host':>9}"
        + ("  replica" if r.target.gateway else ""),
    ]
    again = f"4 R again (best of {len(r.again_ttfts)})" if len(r.again_ttfts) > 1 else "4 R again"
    steps = (("1 R cold", r.cold), ("3 R after eviction", r.after), (again, r.again))
    for (name, g), seed in zip(steps, SEED_RATIOS, strict=True):
        lines.append(_row(name, g, r.cold.ttft_s, seed, r.target.gateway))
    lines += ["", _host_line(r.host_used), f"verdict: {r.verdict.outcome}: {r.verdict.reason}"]
    return "\n".join(lines + [f"  note: {n}" for n in r.verdict.notes])


def _dump(doc: Any) -> str:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def probe_json(r: ProbeResult) -> str:
    doc = {
        "target": {"url": r.target.url, "gateway": r.target.gateway, "version": r.target.version},
        "replica": dataclasses.asdict(r.pool),
        "seed": r.seed,
        "prompts_as_token_ids": r.token_ids,
        "r_digest": r.r_digest,
        "context_note": r.context_note,
        "plan": dataclasses.asdict(r.plan),
        "pressure": {"contexts": r.pressure_contexts, "served_tokens": r.pressure},
        "steps": {
            "cold": dataclasses.asdict(r.cold),
            "after_eviction": dataclasses.asdict(r.after),
            "again": dataclasses.asdict(r.again),
        },
        "again_ttfts": r.again_ttfts,
        "host_used_tokens": dict(zip(("before", "after_pressure", "end"), r.host_used, strict=True)),
        "verdict": dataclasses.asdict(r.verdict),
    }
    return _dump(doc)


AB_HEADER = "  phase     TTFT s           min-max  prefill tok/s    cached    device      host"


def _phase_row(phase: Phase) -> str:
    g = phase.last
    span = f"{min(phase.ttfts):.3f}-{max(phase.ttfts):.3f}"
    return (
        f"  {phase.name:<6} {phase.median:>9.3f} {span:>17} {phase.prefill_rate:>14,.0f} "
        f"{_count(g.cached_tokens):>9} {_count(g.device):>9} {_count(g.host):>9}"
    )


def ab_text(results: list[AbResult]) -> str:
    first = results[0]
    lines = [
        f"kvroute ab: {first.prompt_tokens:,}-token prompt, median of {first.runs} runs, "
        f"/flush_cache before each cold run (seed {first.seed})"
    ]
    for r in results:
        lines += ["", r.target.describe(), AB_HEADER]
        lines += [_phase_row(r.cold), _phase_row(r.hot), f"  hot is {r.speedup:.1f}x faster than cold"]
        lines += [f"  note: {n}" for n in r.notes]
    lines += [
        "",
        "prefill tok/s = prompt tokens / TTFT (hot: an equivalent rate, the cached part was not recomputed)",
    ]
    return "\n".join(lines)


def ab_json(results: list[AbResult]) -> str:
    docs = []
    for r in results:
        phases = {
            p.name: {"ttfts": p.ttfts, "median": p.median, "prefill_rate": p.prefill_rate,
                     "last": dataclasses.asdict(p.last)}
            for p in (r.cold, r.hot)
        }  # fmt: skip
        target = {"url": r.target.url, "gateway": r.target.gateway, "version": r.target.version}
        pools = [dataclasses.asdict(p) for p in r.target.pools]
        docs.append({"target": target, "replicas": pools, "runs": r.runs, "seed": r.seed,
                     "prompt_tokens": r.prompt_tokens, "speedup": r.speedup, "phases": phases,
                     "notes": list(r.notes)})  # fmt: skip
    return _dump({"results": docs})
