"""The warmrag benchmark's numbers (issue 12's targets) from its runs, and its JSON and Markdown tables.

Pure functions over `bench.runs.replay.Record`s and the gateway's warm-up answers (`POST /v1/warmup` with
`wait: true`: per document its id, tokens and, per replica, the tier it sits in now per the cache model):

- `doc_indices(requests, docs)`: request index -> the rag document its system message carries.
- `warm_tiers(view)`: document id -> the tier of its first placement right after the warm-up
  (`gpu`, `host`, `storage`, `cold`; `unplaced` without a placement).
- `first_vs_repeat`: mean TTFT of the first questions (optionally only those about some documents) over
  the mean TTFT of the repeats, and how many first questions were served cold (cached_tokens below
  COLD_SHARE of the prompt).
- `warm_rate`: warmed tokens per modelled second; `prefill_rate`: the fleet's cold prefill tokens per
  modelled second for documents of n tokens (replicas x n / prefill_seconds(0, n)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.reports.comparison import NAN, hit_ratio, mean_ttft, ratio, verdict, within
from bench.runs.replay import Record
from bench.workloads.generators import RAG_INSTRUCTION, TimedRequest
from emulator.timing import ProfileTiming, ttft_seconds

FIRST_TARGET = 1.2  # mean first-question TTFT after warm-up <= 1.2x a repeat's
THROUGHPUT_TARGET = 0.9  # warming >= 0.9x the fleet's emulated cold prefill throughput
LIVE_TOLERANCE = 0.10  # live TTFT during a warm-up within 10% of the same traffic without one
COLD_SHARE = 0.5  # a first question with less than this share of its prompt cached was a cold prefill


@dataclass(frozen=True, slots=True)
class FirstVsRepeat:
    first_s: float
    repeat_s: float
    firsts: int
    cold: int  # first questions served cold (cached < COLD_SHARE of the prompt)

    @property
    def ratio(self) -> float:
        return ratio(self.first_s, self.repeat_s)


def doc_indices(requests: Iterable[TimedRequest], docs: Sequence[str]) -> dict[int, int]:
    """Request index -> index of the document in its system message (requests without one: absent)."""
    by_text = {RAG_INSTRUCTION + "\n\n" + d: i for i, d in enumerate(docs)}
    out = {}
    for r in requests:
        messages = r.body.get("messages") or ()
        content = messages[0].get("content") if messages else None
        if isinstance(content, str) and content in by_text:
            out[r.index] = by_text[content]
    return out


def warm_tiers(view: Mapping[str, Any]) -> dict[str, str]:
    """Document id -> the tier its first placement sits in per the warm-up answer's `now`."""
    out = {}
    for d in view.get("documents") or ():
        placements = d.get("replicas") or ()
        out[d["id"]] = (placements[0].get("now") or {}).get("tier", "cold") if placements else "unplaced"
    return out


def is_cold(r: Record) -> bool:
    return r.prompt_tokens > 0 and r.cached_tokens < COLD_SHARE * r.prompt_tokens


def first_vs_repeat(records: Sequence[Record], about: Iterable[int] | None = None) -> FirstVsRepeat:
    """First questions (only those of request indices `about`, when given) against every repeat."""
    keep = None if about is None else set(about)
    firsts = [r for r in records if r.ok and r.tag == "first" and (keep is None or r.index in keep)]
    repeats = [r for r in records if r.ok and r.tag == "repeat"]
    cold = sum(1 for r in firsts if is_cold(r))
    return FirstVsRepeat(mean_ttft(firsts), mean_ttft(repeats), len(firsts), cold)


def indices_about(doc_of: Mapping[int, int], docs: Iterable[int]) -> list[int]:
    wanted = set(docs)
    return [i for i, d in doc_of.items() if d in wanted]


def by_quarter(records: Sequence[Record], reference: Sequence[Record]) -> list[float]:
    """Mean TTFT of `records` over the same requests' in `reference` (matched by index, both ok), per
    quarter of the arrival span (by scheduled arrival; the span ends at the last one)."""
    ref = {r.index: r for r in reference if r.ok}
    pairs = [(r, ref[r.index]) for r in records if r.ok and r.index in ref]
    end = max((r.due_s for r, _ in pairs), default=0.0) or 1.0
    quarters: list[list[tuple[Record, Record]]] = [[], [], [], []]
    for a, b in pairs:
        quarters[min(3, int(4 * a.due_s / end))].append((a, b))
    return [ratio(mean_ttft(a for a, _ in q), mean_ttft(b for _, b in q)) for q in quarters]


def ideal_host_over_gpu(timing: ProfileTiming, prompt: int, cached: int) -> float:
    """The profile's TTFT of a host reload of `cached` tokens over a GPU hit of them (no queueing)."""
    gpu = ttft_seconds(timing, prompt, cached, 0, 0)
    return ratio(ttft_seconds(timing, prompt, cached, cached, 0), gpu)


def warm_rate(tokens: float, wall_s: float, time_scale: float) -> float:
    """Warmed tokens per modelled second (wall seconds / time scale)."""
    return tokens / (wall_s / time_scale) if wall_s > 0 else NAN


def prefill_rate(timing: ProfileTiming, replicas: int, n: int) -> float:
    seconds = timing.prefill_seconds(0, n)
    return replicas * n / seconds if seconds > 0 else NAN


def first_numbers(
    requests: Sequence[TimedRequest], docs: Sequence[str], records: Sequence[Record], view: Mapping[str, Any]
) -> dict[str, Any]:
    """First vs repeat for every document, and per tier the warm-up answer put documents in."""
    doc_of, tiers = doc_indices(requests, docs), warm_tiers(view)
    in_tier = {t: [int(k.rsplit("-", 1)[1]) for k, v in tiers.items() if v == t] for t in set(tiers.values())}
    by_tier = {t: _fvr(first_vs_repeat(records, indices_about(doc_of, d))) for t, d in in_tier.items()}
    host = by_tier.get("host", _fvr(FirstVsRepeat(NAN, NAN, 0, 0)))
    counts = {t: len(d) for t, d in in_tier.items()}
    return {
        "all": _fvr(first_vs_repeat(records)),
        "host": host,
        "by_tier": by_tier,
        "tiers_after_warmup": counts,
    }


def _fvr(f: FirstVsRepeat) -> dict[str, Any]:
    return {
        "first_s": f.first_s,
        "repeat_s": f.repeat_s,
        "firsts": f.firsts,
        "cold": f.cold,
        "ratio": f.ratio,
    }


def live_numbers(
    cold: Sequence[Record], live: Sequence[Record], job: Mapping[str, Any], again: Sequence[Record]
) -> dict[str, Any]:
    """Live TTFT with a warm-up alongside over without (and the noise floor: `again` over `cold`)."""
    docs = job.get("documents") or ()
    without, with_ = mean_ttft(cold), mean_ttft(live)
    return {"without_s": without, "with_s": with_, "ratio": ratio(with_, without),
            "hit_ratio_without": hit_ratio(cold), "hit_ratio_with": hit_ratio(live),
            "warmup_documents": len(docs), "warm_by_end": sum(1 for d in docs if d["status"] == "warm"),
            "noise_ratio": ratio(mean_ttft(again), without),
            "by_quarter": by_quarter(live, cold), "noise_by_quarter": by_quarter(again, cold)}  # fmt: skip


def ideal_ratio(timing: ProfileTiming, records: Sequence[Record]) -> float:
    """The profile's host reload over GPU hit TTFT for the run's mean first question (no queueing)."""
    firsts = [r for r in records if r.ok and r.tag == "first"]
    n = max(1, len(firsts))
    prompt, cached = (
        round(sum(getattr(r, k) for r in firsts) / n) for k in ("prompt_tokens", "cached_tokens")
    )
    return ideal_host_over_gpu(timing, prompt, cached)


def targets(found: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The PASS/MISS rows (and the printed ratio) from `found` (bench.warmrag.bench's numbers)."""
    first, host = found["first_vs_repeat"], found["first_vs_repeat_host"]
    thr, live = found["throughput"], found["live"]
    return [
        _row("first question / repeat TTFT after warm-up", first["ratio"], "<= 1.2x",
             first["ratio"] <= FIRST_TARGET and first["cold"] == 0),
        _row("  documents warmed beyond GPU (host)", host["ratio"], "<= 1.2x, never cold",
             host["ratio"] <= FIRST_TARGET and host["cold"] == 0 and host["firsts"] > 0),
        _row("first question TTFT without / with warm-up", found["without_vs_with"], "printed", None),
        _row("warm throughput / fleet cold prefill", thr["ratio"], ">= 0.9x",
             thr["ratio"] >= THROUGHPUT_TARGET),
        _row("live TTFT with / without a warm-up running", live["ratio"], "within 10%",
             within(live["ratio"], LIVE_TOLERANCE)),
    ]  # fmt: skip


def _row(name: str, value: float, target: str, ok: bool | None) -> dict[str, Any]:
    return {"target": name, "value": value, "goal": target, "verdict": "-" if ok is None else verdict(ok)}


def markdown(found: Mapping[str, Any], command: str, wall_s: float) -> str:
    rows = targets(found)
    lines = ["# warmrag: issue 12's targets", "", f"`{command}` ({wall_s:.0f} s wall)", ""]
    lines += ["| target | measured | goal | verdict |", "|---|---:|---|---|"]
    lines += [f"| {r['target']} | {r['value']:.3f} | {r['goal']} | {r['verdict']} |" for r in rows]
    lines += ["", "## Details", ""] + [f"- {k}: {_short(v)}" for k, v in found.items()]
    return "\n".join(lines) + "\n"


def _short(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def write(out: Path, found: Mapping[str, Any], command: str, wall_s: float) -> str:
    """Writes warmrag.json and warmrag.md under `out`; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "wall_s": round(wall_s, 1), "targets": targets(found), **found}
    (out / "warmrag.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = markdown(found, command, wall_s)
    (out / "warmrag.md").write_text(text)
    return text
