"""The fleet section of bench/README.md, regenerated from the results on disk after every run.

Everything between FLEET_BEGIN and FLEET_END is rewritten: the method (SECTION_HEAD), the commands
and wall times of the runs behind the results, the cross-point summary table, the plots, then every
point's table grouped by workload, each under the caption that names its workload, profile, load, seeds
and date. The rest of the file (e.g. the gateway overhead section) is kept as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

FLEET_BEGIN = "<!-- fleet-bench:begin -->"
FLEET_END = "<!-- fleet-bench:end -->"


class PointLike(Protocol):
    @property
    def workload(self) -> str: ...
    @property
    def table_md(self) -> str: ...
    @property
    def path(self) -> Path: ...


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def _runs(runs: Sequence[Mapping[str, object]]) -> list[str]:
    lines = ["Runs behind these results (each table's caption gives its date):", ""]
    for r in runs:
        wall = float(str(r.get("wall_s", "nan")))
        date = f", {r['date']}" if r.get("date") else ""
        lines.append(f"- `{r.get('command')}`: {wall / 60:.1f} min wall{date}")
    return lines


def section(
    base: Path,
    runs: Sequence[Mapping[str, object]],
    summary_md: str,
    plots: Sequence[Path],
    points: Sequence[PointLike],
) -> str:
    """The fleet section's text; paths are shown relative to `base` (the README's directory's parent)."""
    if not points:
        return SECTION_HEAD.rstrip("\n") + "\n\nNo results of this benchmark yet: run `make bench`."
    lines = [SECTION_HEAD.rstrip("\n"), "", *_runs(runs), ""]
    lines += ["### Summary", "", SUMMARY_NOTE.rstrip("\n"), "", summary_md, ""]
    lines += [f"![{p.stem}]({_rel(p, base / 'bench')})" for p in plots]
    workload = None
    for p in points:
        if p.workload != workload:
            workload = p.workload
            lines += ["", f"### {workload}", ""]
        lines += _point_lines(p, base)
    return "\n".join(lines)


def _point_lines(p: PointLike, base: Path) -> list[str]:
    """One point in brief: its caption, kvroute's verdict, and a link to its full table and plots."""
    text = p.table_md.strip().splitlines()
    caption = text[0] if text else p.workload
    verdict = [ln for ln in text if ln.startswith("kvroute-cost:")]
    where = _rel(p.path, base / "bench")
    return [f"- {caption}", *(f"  - {v}" for v in verdict), f"  - [table and plots]({where}/table.md)"]


def update(
    readme: Path,
    runs: Sequence[Mapping[str, object]],
    summary_md: str,
    plots: Sequence[Path],
    points: Sequence[PointLike],
) -> None:
    """Rewrite the fleet section of `readme` (appended if the markers are missing); keep the rest."""
    text = readme.read_text() if readme.exists() else "# kvroute benchmarks\n"
    if FLEET_BEGIN not in text or FLEET_END not in text:
        text = text.rstrip("\n") + "\n\n" + FLEET_BEGIN + "\n" + FLEET_END + "\n"
    before, rest = text.split(FLEET_BEGIN, 1)
    after = rest.split(FLEET_END, 1)[1]
    body = section(readme.parent.parent, runs, summary_md, plots, points)
    readme.write_text(before + FLEET_BEGIN + "\n" + body + "\n" + FLEET_END + after)


SUMMARY_NOTE = """One row per (workload, profile, load). kvroute is its default policy (`cost`); "best other
non-oracle" is the system with the lowest mean TTFT among the others but the oracle (the p99 ratio uses
the lowest p99, which may be another system); ratio = kvroute / best other (< 1: kvroute wins); "vs
sglang cache_aware" = kvroute / sglang-router's `cache_aware`; floor x = kvroute / the floor (>= 1).
Also in `bench/results/summary.{md,json}`.
"""

SECTION_HEAD = """## Fleet benchmark

    make bench                         # the plan below (~55 min), then bench.gateways and bench.warmrag (~5)
    kvroute bench --matrix             # every workload x every system (10), seeds' profile, load 0.6, seed 1
    kvroute bench rag rag_user --load 0.3,0.9 --profile h200 --seeds 1,2 --systems kvroute-cost,oracle
    kvroute bench hot --quick          # small and fast, under /tmp/kvroute-bench-quick, README untouched
    python -m bench.ab HEAD~1 HEAD rag:0.6 mixed:0.9 agent --seeds 1,2,3   # two revisions side by side

The default plan (`bench/runs/plan.py`): workloads rag, rag_user, mixed, hot and noreuse on the seeds'
profile (`rtx3090x2`) at offered load 0.6 as the mean of seeds 1-3 and at loads 0.3 and 0.9 with seed
1, and on the datacenter profile (`h200`, `emulator/timing.py`) at load 0.6 with seed 1; the rag
variants rag_restart and rag_tenants on the seeds' profile at load 0.6 with seed 1 only; agent and
probe at their own pace (closed loop) on the seeds' profile, seed 1. Systems: `kvroute-cost`,
`kvroute-cache_aware`, `kvroute-least_load`, `sglang-cache_aware`, `sglang-round_robin`, `client-rr`,
`oracle`, and the floor row.

For every (point, workload, seed, system) the runner starts FRESH emulated SGLang replicas (4;
`--emu-profile P --enable-hierarchical-cache --hicache-write-policy write_back --hicache-ratio 2
--enable-cache-report --enable-metrics --emu-debug`, GPU pool capped at 48K tokens by
`--max-total-tokens`), starts the system from its command template, waits until it is ready (a router:
until it counts every replica healthy), replays the workload with streaming and
`stream_options.include_usage`, and stops everything it started. Time runs 5x faster than modelled
(`--time-scale 0.2`; agent and probe 0.1; on `h200`, whose requests come twice as often at one load,
0.4), so CPU that other processes take from the 2 shared cores
stretches modelled TTFTs: a run during which they used more than 0.4 cores on average (`bench/runs/cpu.py`)
is repeated once and the less disturbed of the two kept, and a run still disturbed by more than 0.2
cores is named under its table (results measured before this check, 2026-12-01 10:10 UTC, carry no
such note).

Systems: `kvroute-<policy>` (cost, round_robin, least_load, cache_aware, consistent_hash),
`sglang-<policy>` (sglang-router 0.3.2: cache_aware, round_robin, power_of_two), `client-rr` (no proxy,
the client rotates replica URLs) and `oracle` (`bench/systems/oracle.py`: asks every emulator `POST
/_emu/predict` for the true predicted TTFT of this request and forwards to the lowest; greedy per
request, so not a bound: under load it sends a document to the shortest queue even where that means
computing it again).

Offered load (`bench/workloads/load.py`): the emulator's prefill engine is one serial resource per replica, so
the fleet has `replicas` prefill-seconds of capacity per second. A request's work is the prefill a
perfect router must still spend on it, the floor's per-request prefill seconds (`bench/workloads/floor.py`:
every earlier prefix already on GPU); offered load = sum of that work / (replicas x arrival span, last
arrival - first). Open-loop workloads are generated at a nominal rate, then every arrival time is
multiplied so that the offered load is the point's. Each table also gives the load in cold-prefill
terms (the same sum with whole prompts computed): what a router that never reused anything would face.

Workloads (seeded; sized so the working set exceeds the fleet's GPU pools but fits GPU + host; output
lengths log-uniform in 32-512 tokens, the probe's 8): `rag` and `rag_user` (tens of ~6K-token
documents, 1.6x the fleet's GPU pools, Zipf(0.9) popularity, questions arriving steadily from the
start, while documents are first seen; `rag` puts the document in the system message, `rag_user` in the
user message before the question, as many RAG frameworks do; same documents, questions and arrivals),
`rag_restart` (rag while replica 0 is killed at 40% of the arrival span and comes back 10 modelled
seconds later with an empty GPU and host cache, storage kept: the emulator's restart fault with
`down_s`, posted on time by `bench/runs/outages.py` for every system, on a fleet started with
`--emu-enable-faults`; meanwhile its generation connections are reset and its health probes answer
503; the routers notice the return by health checks on wall-clock intervals, 5x longer in modelled time
here, so no router used the replica again before the last arrival: the run measures the loss),
`rag_tenants` (rag asked by two tenants, each request's drawn 50/50 and sent as its `cache_salt`,
so one document under two salts is two prefixes; same documents, questions and arrivals as rag;
sglang-router 0.3.2 drops `cache_salt` from the body it forwards, so behind it the replicas cache both
tenants in one namespace and its hit ratio can exceed the floor's),
`mixed` (long documents interleaved with short chat), `hot` (80% of requests on one document, each with
its own 500-1000 tokens of notes), `noreuse` (unique prompts), `agent` (multi-turn sessions sharing a
~6K-token system prompt + tool schemas; each turn appends a tool output and a fixed-length
deterministic stand-in of the previous reply; sessions send `x-session-id`), `probe` (the seeds'
eviction-reuse probe, sequential: cold documents, eviction pressure, re-send, re-send).

Columns: TTFT in modelled seconds (wall / time scale, so comparable to the seeds' figures; CPU time of
the client, proxy and emulator is included and scaled up by the same factor), counted from each
request's scheduled arrival (for a closed-loop request: when it became due), so a request the client or
the system kept waiting counts in full; "send-TTFT s" is the mean from when the client sent it. The
client caps requests in flight at 1024, far above any workload's need; a request that finds the cap
full is counted and named under the table. Hit ratio = sum cached_tokens / sum prompt_tokens; req/s in
modelled time; "max req/replica" = requests served by the busiest replica (emulator counters); "max
prefill s/replica" and "max/mean prefill" = prefill seconds the busiest replica spent and its ratio to
the fleet mean, where a replica's prefill seconds are the timing model's cost of the uncached part of
every request it served (its reported cached tokens) plus its host and storage reloads (its
`/_emu/state` counters). Balance is judged in TTFT (the old target of max/mean requests per replica <=
1.3 is withdrawn); max/mean shows where the work went. Errors (requests cut by the wall-clock cap of a
run, 60 s + 4x its arrival span, and on rag_restart requests the system let fail on the killed replica)
are counted in "errors" and left out of the TTFT statistics. Extra columns: rag's and its variants'
first question on a document (on rag_tenants: per tenant; "first s") and the others ("repeat s");
mixed's short and long requests; probe's cold sends and the documents re-sent after eviction pressure.
The `floor` row is not a system: each request's TTFT from the timing model on an idle replica holding
every prefix sent before it, on GPU (no queueing, unbounded cache), so no router can go below it; its
hit ratio is the most any placement can reach (it keeps each cache salt's prefixes apart, and ignores
rag_restart's outage). With several seeds each column is the mean over seeds (requests and errors
summed). The line under each table compares kvroute's default policy (cost) with the best other
non-oracle system, the oracle and the floor, and gives kvroute's cache model error (sum |predicted -
reported cached tokens| / sum prompt tokens, from the gateway's `/status`).
"""
