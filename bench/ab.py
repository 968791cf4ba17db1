"""Two revisions of the gateway side by side: `python -m bench.ab BASE CANDIDATE POINT... [options]`.

A change of the default policy is judged against the code before it, in one batch: each revision (any
git revision: a commit, a branch, HEAD~2) is checked out into its own detached git worktree under a
temporary directory, and both run as `kvroute serve --policy cost` on the same workloads, each run on a
fresh emulated fleet (`bench.point`: same seed, same offered load, same fleet settings, the CPU check
that repeats a disturbed run). Only the gateway's code differs: the emulator, the workloads and the
client are the current checkout's. The gateway runs with `PYTHONSAFEPATH=1` and `PYTHONPATH` = its
worktree, so the current directory's `proxy/` cannot shadow it. (Not to be confused with `kvroute ab`,
diag's cold/hot probe of SGLang servers.)

POINT is `workload:load[:profile]` (open loop at that offered load; profile `rtx3090x2` by default) or
`workload` alone (closed-loop workloads at their own pace). The two revisions take turns in an order
that alternates from one run to the next, so neither always runs first. `--exact` gives both gateways
the emulator's tokenizer and the replicas KV events (as `bench.exact`'s exact gateway).

Every run appends one JSON line to OUT/ab.jsonl (mean and p99 TTFT from each request's scheduled
arrival, per-tag means, hit ratio, cache model error, other processes' CPU); OUT/ab.md has one row per
point and seed with candidate / base ratios and both revisions' errors (requests that failed: left out
of the means, so read them beside the ratio), and the geometric mean of the mean-TTFT ratio per point
and over all of them. Read every row, not only the geomean: a policy that wins one point and loses
another is not a win (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from statistics import geometric_mean
from typing import Any

from bench import exact, point
from bench.reports import tables as report
from bench.runs import plan
from bench.runs.plan import Point
from bench.systems import registry as systems
from bench.systems.fleet import FleetSpec
from bench.workloads import generators as workloads


def parse_point(text: str) -> Point:
    """`rag:0.6`, `rag:0.9:h200` or `agent` (own pace), seed 1 (the seeds come from --seeds)."""
    name, _, rest = text.partition(":")
    load, _, profile = rest.partition(":")
    if not name:
        raise ValueError(f"point {text!r}: no workload")
    return Point(profile or plan.DEFAULT_PROFILE, float(load) if load else None, (1,), (name,))


@contextmanager
def worktrees(revisions: Sequence[str], repo: Path) -> Iterator[list[Path]]:
    """Detached git worktrees of `revisions` under a temporary directory, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="kvroute-ab-") as tmp:
        paths: list[Path] = []
        try:
            for i, rev in enumerate(revisions):
                path = Path(tmp) / f"rev{i}"
                git(repo, "worktree", "add", "--detach", str(path), rev)
                paths.append(path)
            yield paths
        finally:
            for path in paths:
                git(repo, "worktree", "remove", "--force", str(path))


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def gateway(name: str, code: Path, with_events: bool) -> systems.System:
    """kvroute's default policy from the code at `code` (its worktree)."""
    extra = ("--tokenizer-path", exact.TOKENIZER) if with_events else ()
    env = {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1"}
    return replace(systems.kvroute("cost", *extra), name=f"kvroute-{name}", env=env)


def row(pair: int, label: str, seed: int, system: str, result: point.RunResult) -> dict[str, Any]:
    """One run's line of ab.jsonl (a system that never became ready: its reason, no figures); `pair`
    numbers the point-and-seed the two revisions ran (a point may be given more than once)."""
    if result.records is None:
        return {"pair": pair, "point": label, "seed": seed, "system": system, "skipped": result.skipped,
                "mean": None}  # fmt: skip
    s = report.summarize(system, result.records, result.per_replica, result.work, "",
                         result.model_error, result.foreign_cpu)  # fmt: skip
    return {"pair": pair, "point": label, "seed": seed, "system": system, "requests": s.requests,
            "errors": s.errors,
            "mean": s.mean_ttft, "p99": s.p99_ttft, "hit": s.hit_ratio, "tags": s.by_tag,
            "model_error": s.model_error, "foreign_cpu": s.foreign_cpu}  # fmt: skip


def table(rows: Sequence[dict[str, Any]], base: str, candidate: str) -> str:
    """ab.md: per point and seed, both revisions and candidate / base; geomeans per point and overall."""
    runs = {(r["pair"], r["system"]): r for r in rows}
    head = (
        f"| point | seed | {base} mean s | {candidate} mean s | ratio | p99 ratio | hit ratio (base, cand.) "
        "| errors (base, cand.) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    by_point: dict[str, list[float]] = {}
    for (pair, system), b in runs.items():
        c = runs.get((pair, candidate))
        if system != base or c is None or not (b["mean"] or 0) > 0 or c["mean"] is None:
            continue
        label, seed = b["point"], b["seed"]
        ratio = c["mean"] / b["mean"]
        by_point.setdefault(label, []).append(ratio)
        lines.append(f"| {label} | {seed} | {b['mean']:.3f} | {c['mean']:.3f} | {ratio:.3f} | "
                     f"{c['p99'] / b['p99']:.3f} | {b['hit']:.3f}, {c['hit']:.3f} | "
                     f"{b.get('errors', 0)}, {c.get('errors', 0)} |")  # fmt: skip
    every = [r for v in by_point.values() for r in v]
    lines += ["", "| point | runs | geomean of mean-TTFT ratios |", "|---|---|---|"]
    lines += [f"| {p} | {len(v)} | {geometric_mean(v):.3f} |" for p, v in by_point.items()]
    if every:
        lines.append(f"| all | {len(every)} | {geometric_mean(every):.3f} |")
    return "\n".join(lines) + "\n"


async def run(a: argparse.Namespace, paths: list[Path]) -> list[dict[str, Any]]:
    pair = [gateway("base", paths[0], a.exact), gateway("candidate", paths[1], a.exact)]
    fleet = FleetSpec.default(4, a.quick, a.time_scale, None)
    if a.exact:
        fleet = replace(fleet, tokenizer=exact.TOKENIZER, kv_events=exact.EVENTS)
    settings = point.RunSettings(tuple(pair), fleet, a.quick, a.out, a.max_run_seconds, "ab", a.time_scale)
    rows, turn = [], 0
    for label in a.points:
        name = parse_point(label).workloads[0]
        for seed in a.seeds:
            prep = point.prepare(settings, replace(parse_point(label), seeds=(seed,)), name, seed)
            for system in pair if turn % 2 == 0 else pair[::-1]:
                result = await point.run_system(prep, system, seed, a.out / "logs")
                rows.append(row(turn, label, seed, system.name, result))
                with (a.out / "ab.jsonl").open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
            turn += 1
    return rows


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    p.add_argument("base", help="git revision of the code before the change")
    p.add_argument("candidate", help="git revision of the change")
    p.add_argument("points", nargs="+", help="workload:load[:profile], or workload for its own pace")
    p.add_argument("--seeds", type=plan.seeds_arg, default=(1,), help="comma-separated seeds (default 1)")
    p.add_argument("--exact", action="store_true", help="tokenizer and KV events, as bench.exact's exact")
    p.add_argument("--time-scale", type=float, default=None, help="default: each workload's own")
    p.add_argument("--quick", action="store_true", help="the benchmark's small workloads")
    p.add_argument("--max-run-seconds", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=None, help="default: a new directory under /tmp")
    a = p.parse_args(argv)
    for label in a.points:
        try:
            name = parse_point(label).workloads[0]
        except ValueError as exc:
            p.error(str(exc))
        if name not in workloads.GENERATORS:
            p.error(f"unknown workload {name!r}; known: {', '.join(workloads.GENERATORS)}")
    a.out = a.out or Path(tempfile.mkdtemp(prefix="kvroute-ab-results-"))
    a.out.mkdir(parents=True, exist_ok=True)
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    repo = Path(__file__).resolve().parent.parent
    revs = [git(repo, "rev-parse", "--short", r) for r in (a.base, a.candidate)]
    with worktrees(revs, repo) as paths:
        rows = asyncio.run(run(a, paths))
    md = f"`python -m bench.ab {shlex.join(argv)}` (base {revs[0]}, candidate {revs[1]})\n\n"
    md += table(rows, "kvroute-base", "kvroute-candidate")
    (a.out / "ab.md").write_text(md)
    print(md)
    print(f"results: {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
