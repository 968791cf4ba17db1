"""Summaries, markdown tables and the JSON files of one (workload, profile, load) point.

Definitions (all over one workload x system run; times in modelled seconds):
- TTFT runs from each request's scheduled arrival (bench/runs/replay.py); "send-TTFT" from when the client
  sent it. Statistics over successful requests; percentiles by linear interpolation between order
  statistics (p50 of [1, 2, 3, 4] is 2.5).
- token-weighted cache hit ratio = sum(cached_tokens) / sum(prompt_tokens) over successful requests
  (a 40K-token hit weighs 400 times a 100-token one, as GPU time does).
- throughput = successful requests / makespan, makespan = last completion - first send.
- per-replica load: requests each replica served (emulator counters when available, else the
  per-request attribution), and the prefill seconds it spent (bench.reports.fleet_work.replica_work); the
  balance column is max/mean of the prefill seconds, the mean over every replica of the fleet.
- capped: requests that found the client's concurrency cap full (should be 0; printed when not).
- extra columns: the mean TTFT of some request tags (EXTRA_COLUMNS); "resent" = the probe's resend1
  and resend2 together: the documents re-sent after eviction pressure.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.runs.replay import CLIENT_CAP, Record
from bench.workloads.floor import FloorRequest

FLOOR = "floor"
SUBJECT = "kvroute-cost"
ORACLE = "oracle"
NAN = float("nan")
EXTRA_COLUMNS: dict[str, tuple[str, ...]] = {
    "probe": ("cold", "resend1", "resend2", "resent"),
    "mixed": ("short", "long"),
    "rag": ("first", "repeat"),
    "rag_user": ("first", "repeat"),
    "rag_restart": ("first", "repeat"),
    "rag_tenants": ("first", "repeat"),
}


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return NAN
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else NAN


def hit_ratio(records: Sequence[Record]) -> float:
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0


def balance(per_replica: Mapping[str, float]) -> tuple[float, float]:
    """(the busiest replica's value, max / mean), the mean over every replica in the fleet."""
    if not per_replica:
        return 0.0, NAN
    values = list(per_replica.values())
    avg = sum(values) / len(values)
    return max(values), (max(values) / avg if avg else NAN)


@dataclass(frozen=True, slots=True)
class Summary:
    system: str
    requests: int
    errors: int
    mean_ttft: float
    p50_ttft: float
    p99_ttft: float
    mean_send_ttft: float
    hit_ratio: float
    throughput: float
    max_replica: int  # requests served by the busiest replica
    max_work: float  # prefill seconds of the busiest replica
    work_max_over_mean: float
    per_replica: dict[str, int] = field(default_factory=dict)
    work_per_replica: dict[str, float] = field(default_factory=dict)
    by_tag: dict[str, float] = field(default_factory=dict)
    capped: int = 0
    note: str = ""
    model_error: float = NAN  # kvroute: sum |predicted - reported cached| / sum prompt tokens
    foreign_cpu: float = NAN  # cores other processes on the machine used during the run (bench/runs/cpu.py)
    engine_loss: float = NAN  # evicted under waiting requests (bench.reports.fleet_work.cache_loss)


def tag_means(pairs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Mean TTFT per request tag, plus "resent" (resend1 and resend2 together) when the probe has them."""
    tags: dict[str, list[float]] = {}
    for tag, ttft in pairs:
        tags.setdefault(tag, []).append(ttft)
    by_tag = {t: mean(v) for t, v in sorted(tags.items())}
    resent = tags.get("resend1", []) + tags.get("resend2", [])
    if resent:
        by_tag["resent"] = mean(resent)
    return by_tag


def summarize(
    system: str,
    records: Sequence[Record],
    per_replica: Mapping[str, int] | None = None,
    work: Mapping[str, float] | None = None,
    note: str = "",
    model_error: float = NAN,
    foreign_cpu: float = NAN,
    engine_loss: float = NAN,
) -> Summary:
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    ends = [r.sent_s + (r.e2e_s or 0.0) for r in ok]
    span = (max(ends) - min(r.sent_s for r in ok)) if ok else 0.0
    loads = dict(per_replica) if per_replica else dict(Counter(r.replica for r in ok))
    max_work, work_ratio = balance(work or {})
    return Summary(
        system, len(records), len(records) - len(ok), mean(ttfts), percentile(ttfts, 50),
        percentile(ttfts, 99), mean([r.send_ttft_s for r in ok if r.send_ttft_s is not None]),
        hit_ratio(records), len(ok) / span if span > 0 else 0.0, int(balance(loads)[0]),
        max_work if work else NAN, work_ratio, loads, dict(work or {}),
        tag_means([(r.tag, r.ttft_s or 0.0) for r in ok]), sum(r.capped for r in records), note,
        model_error, foreign_cpu, engine_loss,
    )  # fmt: skip


def by_rank(maps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-replica values averaged by rank over runs ("#1" = the busiest replica of each run, ...):
    replica ids differ between runs, their ranks do not."""
    ranked = [sorted(m.values(), reverse=True) for m in maps if m]
    if not ranked:
        return {}
    return {f"#{i + 1}": mean([r[i] for r in ranked if i < len(r)]) for i in range(max(map(len, ranked)))}


def aggregate(runs: Sequence[Sequence[Summary]]) -> list[Summary]:
    """The mean over seeds of each system present in every run (in the first run's order): TTFT
    statistics, hit ratio, throughput, busiest replica's prefill seconds and balance, per-tag means and
    model error are averaged; requests, errors and capped requests are summed; max requests/replica is
    the largest of the runs; per-replica requests and prefill seconds are averaged by rank (`by_rank`)."""
    if not runs:
        return []
    names = [s.system for s in runs[0] if all(any(t.system == s.system for t in run) for run in runs)]
    out = []
    for name in names:
        rows = [next(s for s in run if s.system == name) for run in runs]
        tags = sorted(set.intersection(*(set(r.by_tag) for r in rows)))

        def avg(attr: str, rows: list[Summary] = rows) -> float:
            return mean([float(getattr(r, attr)) for r in rows])

        out.append(
            Summary(
                name, sum(r.requests for r in rows), sum(r.errors for r in rows), avg("mean_ttft"),
                avg("p50_ttft"), avg("p99_ttft"), avg("mean_send_ttft"), avg("hit_ratio"),
                avg("throughput"), max(r.max_replica for r in rows), avg("max_work"),
                avg("work_max_over_mean"),
                {k: round(v) for k, v in by_rank([r.per_replica for r in rows]).items()},
                by_rank([r.work_per_replica for r in rows]),
                {t: mean([r.by_tag[t] for r in rows]) for t in tags},
                sum(r.capped for r in rows), "; ".join(sorted({r.note for r in rows if r.note})),
                avg("model_error"), max((r.foreign_cpu for r in rows if r.foreign_cpu >= 0), default=NAN),
                avg("engine_loss"),
            )
        )  # fmt: skip
    return out


def floor_summary(ideal: Sequence[FloorRequest]) -> Summary:
    """The floor's row (``bench.workloads.floor``): TTFT statistics and hit ratio; it has no replicas or
    rate."""
    ttfts = [f.ttft_s for f in ideal]
    prompt = sum(f.prompt_tokens for f in ideal)
    hit = sum(f.cached_tokens for f in ideal) / prompt if prompt else 0.0
    by_tag = tag_means([(f.tag, f.ttft_s) for f in ideal])
    return Summary(FLOOR, len(ttfts), 0, mean(ttfts), percentile(ttfts, 50), percentile(ttfts, 99), NAN,
                   hit, NAN, 0, NAN, NAN, {}, {}, by_tag, 0,
                   "no queueing, unbounded cache: every earlier prefix on GPU")  # fmt: skip


def _f(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def table(summaries: Sequence[Summary], extra: Sequence[str] = ()) -> str:
    """Markdown table; `extra` adds the mean TTFT of these request tags (e.g. probe's "resent")."""
    head = ["system", "requests", "errors", "mean TTFT s", "p50 TTFT s", "p99 TTFT s", "send-TTFT s",
            "hit ratio", "req/s", "max req/replica", "max prefill s/replica", "max/mean prefill",
            *(f"{tag} s" for tag in extra)]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        cells = [s.system, str(s.requests), str(s.errors), _f(s.mean_ttft), _f(s.p50_ttft), _f(s.p99_ttft),
                 _f(s.mean_send_ttft), _f(s.hit_ratio, 3), _f(s.throughput),
                 str(s.max_replica) if s.system != FLOOR else "n/a", _f(s.max_work, 1),
                 _f(s.work_max_over_mean)]  # fmt: skip
        cells += [_f(s.by_tag.get(tag, NAN)) for tag in extra]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def best_other(summaries: Sequence[Summary], key: str, subject: str = SUBJECT) -> Summary | None:
    """The non-oracle system other than `subject` with the lowest `key` (the floor is not a system)."""
    others = [
        s
        for s in summaries
        if s.system not in (subject, ORACLE, FLOOR) and getattr(s, key) == getattr(s, key)
    ]
    return min(others, key=lambda s: float(getattr(s, key))) if others else None


def comparison(summaries: Sequence[Summary], subject: str = SUBJECT) -> str:
    """One line: subject's mean/p99 TTFT over the best other non-oracle's and the floor's; hit ratio over
    the oracle's."""
    by_name = {s.system: s for s in summaries}
    me, ref, ideal = by_name.get(subject), by_name.get(ORACLE), by_name.get(FLOOR)
    best_mean, best_p99 = (
        best_other(summaries, "mean_ttft", subject),
        best_other(summaries, "p99_ttft", subject),
    )
    if me is None or best_mean is None or best_p99 is None:
        return ""
    parts = [
        f"{subject}: mean TTFT {_f(me.mean_ttft / best_mean.mean_ttft)}x the best other non-oracle "
        f"({best_mean.system} {_f(best_mean.mean_ttft)} s)",
        f"p99 {_f(me.p99_ttft / best_p99.p99_ttft)}x ({best_p99.system} {_f(best_p99.p99_ttft)} s)",
    ]
    if ref is not None and ref.hit_ratio > 0:
        parts.append(f"hit ratio {_f(me.hit_ratio / ref.hit_ratio)}x the oracle's")
    if "resent" in me.by_tag and ref is not None and "resent" in ref.by_tag:
        parts.append(f"re-sent docs {_f(me.by_tag['resent'] / ref.by_tag['resent'])}x the oracle's TTFT")
    if ideal is not None and ideal.mean_ttft > 0:
        parts.append(
            f"mean TTFT {_f(me.mean_ttft / ideal.mean_ttft)}x the floor ({_f(ideal.mean_ttft)} s; "
            f"the best other non-oracle is {_f(best_mean.mean_ttft / ideal.mean_ttft)}x)"
        )
    if me.model_error == me.model_error:
        parts.append(f"cache model error {me.model_error:.1%} of prompt tokens")
    if me.engine_loss == me.engine_loss:
        parts.append(f"{me.engine_loss:.1%} evicted under requests while they waited")
    return "; ".join(parts) + "."


DISTURBED = 0.2  # cores of other processes during a run worth a note under its table


def notes(summaries: Sequence[Summary], skipped: Mapping[str, str]) -> list[str]:
    """Lines under the table: client-cap hits (should never happen), runs that other processes on the
    machine disturbed, and skipped systems."""
    lines = [
        f"- {s.system}: {s.capped} of {s.requests} requests found the client's cap ({CLIENT_CAP} in "
        "flight) full and waited for a slot; their TTFT still counts from their arrival"
        for s in summaries
        if s.capped
    ]
    lines += [
        f"- {s.system}: other processes on the machine used {s.foreign_cpu:.2f} cores on average during "
        "its run (its TTFTs may be inflated)"
        for s in summaries
        if s.foreign_cpu > DISTURBED
    ]
    return lines + [f"- skipped {name}: {why}" for name, why in skipped.items()]


def write_results(
    target: Path,
    workload: str,
    meta: Mapping[str, object],
    summaries: Sequence[Summary],
    records: Mapping[str, Sequence[Record]],
    skipped: Mapping[str, str],
    caption: str = "",
) -> str:
    """Write summary.json, records.json and table.md under `target`; return the table (with its caption,
    comparison line and notes)."""
    target.mkdir(parents=True, exist_ok=True)
    md = table(summaries, EXTRA_COLUMNS.get(workload, ()))
    for extra in (comparison(summaries), "\n".join(notes(summaries, skipped))):
        if extra:
            md += "\n\n" + extra
    if caption:
        md = caption + "\n\n" + md
    (target / "table.md").write_text(md + "\n")
    doc = {"workload": workload, "meta": meta, "summaries": [asdict(s) for s in summaries],
           "skipped": dict(skipped)}  # fmt: skip
    (target / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if records:  # a mean over seeds has none of its own (they are under seed-N/)
        raw = {name: [asdict(r) for r in recs] for name, recs in records.items()}
        (target / "records.json").write_text(json.dumps(raw, separators=(",", ":")) + "\n")
    return md


def load_summaries(path: Path) -> tuple[dict[str, object], list[Summary]]:
    """(the whole summary.json document, its summaries) as written by `write_results`."""
    doc = json.loads(path.read_text())
    return doc, [Summary(**row) for row in doc["summaries"]]
