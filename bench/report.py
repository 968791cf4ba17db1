"""Summaries, markdown tables, JSON files and the fleet section of bench/README.md.

Definitions (all over one workload x system run; times in modelled seconds):
- TTFT statistics over successful requests; percentiles by linear interpolation between order
  statistics (p50 of [1, 2, 3, 4] is 2.5).
- token-weighted cache hit ratio = sum(cached_tokens) / sum(prompt_tokens) over successful requests
  (a 40K-token hit weighs 400 times a 100-token one, as GPU time does).
- throughput = successful requests / makespan, makespan = last completion - first send.
- per-replica load = generation requests each replica served (emulator counters when available, else
  the per-request attribution); reported as max and max/mean.
- probe extras: mean TTFT of each phase tag (cold, pressure, resend1, resend2); "resent" = resend1 and
  resend2 together: the documents re-sent after eviction pressure.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.floor import FloorRequest
from bench.runner import Record

README_BEGIN = "<!-- fleet-bench:begin -->"
README_END = "<!-- fleet-bench:end -->"


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def hit_ratio(records: Sequence[Record]) -> float:
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0


def load_balance(per_replica: Mapping[str, int]) -> tuple[int, float]:
    """(max requests on one replica, max / mean), the mean over every replica in the fleet."""
    if not per_replica:
        return 0, float("nan")
    counts = list(per_replica.values())
    avg = sum(counts) / len(counts)
    return max(counts), (max(counts) / avg if avg else float("nan"))


@dataclass(frozen=True, slots=True)
class Summary:
    system: str
    requests: int
    errors: int
    mean_ttft: float
    p50_ttft: float
    p99_ttft: float
    hit_ratio: float
    throughput: float
    max_replica: int
    max_over_mean: float
    per_replica: dict[str, int] = field(default_factory=dict)
    by_tag: dict[str, float] = field(default_factory=dict)
    note: str = ""
    model_error: float = float("nan")  # kvroute: sum |predicted - reported cached| / sum prompt tokens


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
    note: str = "",
    model_error: float = float("nan"),
) -> Summary:
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    ends = [r.sent_s + (r.e2e_s or 0.0) for r in ok]
    span = (max(ends) - min(r.sent_s for r in ok)) if ok else 0.0
    loads = dict(per_replica) if per_replica else dict(Counter(r.replica for r in ok))
    peak, ratio = load_balance(loads)
    by_tag = tag_means([(r.tag, r.ttft_s or 0.0) for r in ok])
    return Summary(
        system,
        len(records),
        len(records) - len(ok),
        mean(ttfts),
        percentile(ttfts, 50),
        percentile(ttfts, 99),
        hit_ratio(records),
        len(ok) / span if span > 0 else 0.0,
        peak,
        ratio,
        loads,
        by_tag,
        note,
        model_error,
    )


FLOOR = "floor"


def aggregate(runs: Sequence[Sequence[Summary]]) -> list[Summary]:
    """The mean over seeds of each system present in every run (in the first run's order): TTFT
    statistics, hit ratio, throughput, max/mean, per-tag means and model error are averaged; requests
    and errors are summed; max/replica is the largest of the runs (replica ids differ between runs, so
    per-replica counts are not kept)."""
    if not runs:
        return []
    names = [s.system for s in runs[0] if all(any(t.system == s.system for t in run) for run in runs)]
    out = []
    for name in names:
        rows = [next(s for s in run if s.system == name) for run in runs]
        tags = sorted(set.intersection(*(set(r.by_tag) for r in rows)))
        notes = sorted({r.note for r in rows if r.note})
        out.append(
            Summary(
                name,
                sum(r.requests for r in rows),
                sum(r.errors for r in rows),
                mean([r.mean_ttft for r in rows]),
                mean([r.p50_ttft for r in rows]),
                mean([r.p99_ttft for r in rows]),
                mean([r.hit_ratio for r in rows]),
                mean([r.throughput for r in rows]),
                max(r.max_replica for r in rows),
                mean([r.max_over_mean for r in rows]),
                {},
                {t: mean([r.by_tag[t] for r in rows]) for t in tags},
                "; ".join(notes),
                mean([r.model_error for r in rows]),
            )
        )
    return out


def floor_summary(ideal: Sequence[FloorRequest]) -> Summary:
    """The floor's row (``bench.floor``): TTFT statistics and hit ratio; it has no replicas or rate."""
    ttfts = [f.ttft_s for f in ideal]
    prompt = sum(f.prompt_tokens for f in ideal)
    hit = sum(f.cached_tokens for f in ideal) / prompt if prompt else 0.0
    by_tag = tag_means([(f.tag, f.ttft_s) for f in ideal])
    nan = float("nan")
    return Summary(FLOOR, len(ttfts), 0, mean(ttfts), percentile(ttfts, 50), percentile(ttfts, 99),
                   hit, nan, 0, nan, {}, by_tag,
                   "no queueing, unbounded cache: every earlier prefix on GPU")  # fmt: skip


def _f(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


EXTRA_COLUMNS: dict[str, tuple[str, ...]] = {
    "probe": ("cold", "resend1", "resend2", "resent"),
    "mixed": ("short", "long"),
}


def table(summaries: Sequence[Summary], extra: Sequence[str] = ()) -> str:
    """Markdown table; `extra` adds the mean TTFT of these request tags (e.g. probe's "resent")."""
    head = ["system", "requests", "errors", "mean TTFT s", "p50 TTFT s", "p99 TTFT s", "hit ratio",
            "req/s", "max/replica", "max/mean", *(f"{tag} s" for tag in extra)]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        cells = [s.system, str(s.requests), str(s.errors), _f(s.mean_ttft), _f(s.p50_ttft), _f(s.p99_ttft),
                 _f(s.hit_ratio, 3), _f(s.throughput),
                 str(s.max_replica) if s.max_over_mean == s.max_over_mean else "n/a",
                 _f(s.max_over_mean)]  # fmt: skip
        cells += [_f(s.by_tag.get(tag, float("nan"))) for tag in extra]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def comparison(summaries: Sequence[Summary], subject: str = "kvroute-cost", oracle: str = "oracle") -> str:
    """One line: subject's mean/p99 TTFT over the best other non-oracle's; hit ratio over the oracle's."""
    by_name = {s.system: s for s in summaries}
    me, ref, ideal = by_name.get(subject), by_name.get(oracle), by_name.get(FLOOR)
    others = [s for s in summaries if s.system not in (subject, oracle, FLOOR) and s.mean_ttft == s.mean_ttft]
    if me is None or not others:
        return ""
    best_mean = min(others, key=lambda s: s.mean_ttft)
    best_p99 = min(others, key=lambda s: s.p99_ttft)
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
    return "; ".join(parts) + "."


def write_results(
    out_dir: Path,
    workload: str,
    meta: Mapping[str, object],
    summaries: Sequence[Summary],
    records: Mapping[str, Sequence[Record]],
    skipped: Mapping[str, str],
) -> str:
    """Write summary.json, records.json and table.md under out_dir/<workload>/; return the table."""
    target = out_dir / workload
    target.mkdir(parents=True, exist_ok=True)
    md = table(summaries, EXTRA_COLUMNS.get(workload, ()))
    line = comparison(summaries)
    if line:
        md += "\n\n" + line
    if skipped:
        md += "\n\n" + "\n".join(f"- skipped {name}: {why}" for name, why in skipped.items())
    (target / "table.md").write_text(md + "\n")
    summary = {"meta": meta, "summaries": [asdict(s) for s in summaries], "skipped": dict(skipped)}
    (target / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    if records:  # a mean over seeds has none of its own (they are under seed-N/)
        raw = {name: [asdict(r) for r in recs] for name, recs in records.items()}
        (target / "records.json").write_text(json.dumps(raw, separators=(",", ":")) + "\n")
    return md


def _block(name: str, command: str, meta: Mapping[str, object], md: str) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in meta.items())
    return "\n".join(
        [
            f"<!-- fleet-bench:{name}:begin -->",
            f"### {name}",
            "",
            f"`{command}` ({settings})",
            "",
            md,
            "",
            (
                f"The mean over seeds {meta['seeds']}; each seed's records, summary and plots: "
                f"`bench/results/seed-N/{name}/`."
                if "seeds" in meta
                else f"Raw records, summary and plots: `bench/results/{name}/`."
            ),
            f"<!-- fleet-bench:{name}:end -->",
        ]
    )


def _replace_block(text: str, name: str, block: str) -> str:
    begin, end = f"<!-- fleet-bench:{name}:begin -->", f"<!-- fleet-bench:{name}:end -->"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        return before + block + rest.split(end, 1)[1]
    before, after = text.split(README_END, 1)
    return before + block + "\n\n" + README_END + after


def update_readme(readme: Path, command: str, meta: Mapping[str, object], tables: Mapping[str, str]) -> None:
    """Refresh the fleet section's head and each run workload's block in bench/README.md; keep the rest."""
    text = readme.read_text() if readme.exists() else "# kvroute benchmarks\n"
    if README_BEGIN not in text or README_END not in text:
        text = text.rstrip("\n") + "\n\n" + README_BEGIN + "\n" + README_END + "\n"
    head = "\n".join(["<!-- fleet-bench:head:begin -->", SECTION_HEAD, "<!-- fleet-bench:head:end -->"])
    text = _replace_block(text, "head", head)
    for name, md in tables.items():
        text = _replace_block(text, name, _block(name, command, meta, md))
    readme.write_text(text)


SECTION_HEAD = """## Fleet benchmark (latest tables)

    make bench                       # = kvroute bench all: every workload x every system (~22 min)
    kvroute bench agent probe --quick --systems sglang,oracle,kvroute-cost
    kvroute bench rag --seeds 1,2,3  # each seed's run under seed-N/, the table is their mean

For every workload and every system the runner starts FRESH emulated SGLang replicas (default 4;
`--enable-hierarchical-cache --hicache-write-policy write_back --hicache-ratio 2 --enable-cache-report
--enable-metrics --emu-debug`, GPU pool capped by `--max-total-tokens`), starts the system from its
command template, waits for `GET /v1/models` 200, replays the workload with streaming and
`stream_options.include_usage` (open-loop arrivals, a concurrency cap, a wall-clock cap per run), and
stops everything it started.

Systems: `kvroute-<policy>` (cost, round_robin, least_load, cache_aware, consistent_hash; a policy the
gateway does not have yet is listed as skipped), `sglang-<policy>` (sglang-router 0.3.2: cache_aware,
round_robin, power_of_two), `client-rr` (no proxy, the client rotates replica URLs) and `oracle`
(`bench/oracle.py`: asks every emulator `POST /_emu/predict` for the true predicted TTFT of this
request and forwards to the lowest; being greedy per request it is a strong reference, not a strict
bound).

Workloads (seeded; sized so the working set exceeds the fleet's GPU pools but fits GPU + host):
`agent` (multi-turn sessions sharing a ~6K-token system prompt + tool schemas; each turn appends a
tool output and a fixed-length deterministic stand-in of the previous reply, so every system gets the
same bytes; sessions send `x-session-id`), `rag` (long documents, Zipf popularity, many questions per
document), `probe` (the seeds' eviction-reuse probe, sequential: cold documents, eviction pressure,
re-send, re-send), `noreuse` (unique prompts), `hot` (80% of requests on one document, many
concurrent clients), `mixed` (long documents interleaved with short chat).

Columns: TTFT in modelled seconds (wall / time scale, so comparable to the seeds' figures; CPU time of
the client, proxy and emulator is included and scaled up by the same factor); hit ratio = sum
cached_tokens / sum prompt_tokens; req/s in modelled time; max/replica and max/mean = requests served
by the busiest replica (emulator counters) and its ratio to the fleet mean. probe: mean TTFT of the
first sends ("cold s") and of the documents re-sent after eviction pressure, first and second time
("resend1 s", "resend2 s", both: "resent s"). mixed: mean TTFT of the short and the long requests.
The `floor` row is not a system: it is each request's TTFT from the emulator's timing model on an
idle replica holding every prefix sent before it, on GPU (no queueing, unbounded cache;
`bench/floor.py`), so no router can go below it; its hit ratio is the most any placement can reach.
Seed-to-seed differences on one workload are often larger (~15% on rag) than a policy change's effect:
compare policies with `--seeds`, whose table averages each column over the seeds (requests and errors
are summed).
The line under each table compares kvroute's default policy (cost) with the best other non-oracle
system, the oracle and the floor (issue 5's targets are such ratios), and gives kvroute's cache model
error: sum |predicted - reported cached tokens| / sum prompt tokens over the run, read from the
gateway's `/status`.
"""
