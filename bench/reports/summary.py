"""The cross-point summary: one row per (workload, profile, load), read back from every result on disk.

`collect(out_dir)` reads each point-level OUT/<profile>/<load-dir>/<workload>/summary.json (not the
seed-N/ ones under a mean). Per point, with kvroute's default policy (`cost`) as the subject and the
best other non-oracle system chosen separately for the mean and for p99 (bench.reports.tables.best_other):

    ratio       = kvroute mean TTFT / best other's mean TTFT      (< 1: kvroute wins)
    p99 ratio   = kvroute p99 TTFT / best other's p99 TTFT
    vs sglang   = kvroute mean TTFT / sglang-router cache_aware's mean TTFT
    floor x     = kvroute mean TTFT / the floor's mean TTFT        (>= 1; how far from ideal)

`write_summary` writes OUT/summary.json (with the commands that produced the results, newest last),
OUT/summary.md, a plot per workload (OUT/plots/<workload>.png,
mean TTFT against load per system) and, when asked, the fleet section of bench/README.md
(bench/reports/readme.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.reports import plots, readme
from bench.reports import tables as report
from bench.reports.tables import FLOOR, NAN, SUBJECT, Summary
from bench.runs.plan import OPEN_LOOP, OWN_PACE_WORKLOADS, PROFILES

SGLANG_CACHE_AWARE = "sglang-cache_aware"
ORDER = (*OPEN_LOOP, *OWN_PACE_WORKLOADS)
RUNS_KEPT = 8


@dataclass(frozen=True, slots=True)
class PointResult:
    workload: str
    profile: str
    load: float | None
    seeds: tuple[int, ...]
    table_md: str
    summaries: tuple[Summary, ...]
    path: Path


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    profile: str
    load: float | None
    seeds: str
    kvroute_mean: float
    best_other: str
    best_other_mean: float
    ratio: float
    p99_ratio: float
    vs_sglang: float
    floor_multiple: float


def _key(p: PointResult) -> tuple[int, int, float]:
    """Workloads in plan order, then the seeds' profile first, then loads ascending."""
    rank = ORDER.index(p.workload) if p.workload in ORDER else len(ORDER)
    profile = PROFILES.index(p.profile) if p.profile in PROFILES else len(PROFILES)
    return rank, profile, -1.0 if p.load is None else p.load


def collect(out_dir: Path) -> list[PointResult]:
    points = []
    for path in sorted(out_dir.glob("*/*/*/summary.json")):
        doc, summaries = report.load_summaries(path)
        meta = doc.get("meta")
        if not isinstance(meta, dict) or "seeds" not in meta or "profile" not in meta:
            continue  # not a point of the plan (an older layout)
        table = (path.parent / "table.md").read_text() if (path.parent / "table.md").exists() else ""
        point = PointResult(str(doc["workload"]), str(meta["profile"]), meta.get("load"),
                            tuple(meta["seeds"]), table.strip(), tuple(summaries), path.parent)  # fmt: skip
        points.append(point)
    return sorted(points, key=_key)


def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b and a == a else NAN


def row(p: PointResult) -> Row | None:
    by_name = {s.system: s for s in p.summaries}
    me, ideal, sglang = by_name.get(SUBJECT), by_name.get(FLOOR), by_name.get(SGLANG_CACHE_AWARE)
    best, best_p99 = report.best_other(p.summaries, "mean_ttft"), report.best_other(p.summaries, "p99_ttft")
    if me is None or best is None or best_p99 is None:
        return None
    return Row(
        p.workload, p.profile, p.load, ",".join(map(str, p.seeds)), me.mean_ttft, best.system,
        best.mean_ttft, _ratio(me.mean_ttft, best.mean_ttft), _ratio(me.p99_ttft, best_p99.p99_ttft),
        _ratio(me.mean_ttft, sglang.mean_ttft) if sglang else NAN,
        _ratio(me.mean_ttft, ideal.mean_ttft) if ideal else NAN,
    )  # fmt: skip


def _f(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def table(rows: list[Row]) -> str:
    head = ["workload", "profile", "load", "seeds", "kvroute cost mean s", "best other non-oracle (mean s)",
            "ratio", "p99 ratio", "vs sglang cache_aware", "floor x"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        load = "own pace" if r.load is None else f"{r.load:g}"
        cells = [r.workload, r.profile, load, r.seeds, _f(r.kvroute_mean),
                 f"{r.best_other} ({_f(r.best_other_mean)})", _f(r.ratio), _f(r.p99_ratio),
                 _f(r.vs_sglang), _f(r.floor_multiple)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plots(out_dir: Path, points: list[PointResult]) -> list[Path]:
    """One PNG per sweep workload with results at some load: mean TTFT against load per system."""
    written = []
    for workload in dict.fromkeys(p.workload for p in points if p.load is not None):
        series: dict[str, dict[str, list[tuple[float, float]]]] = {}
        floor: dict[str, list[tuple[float, float]]] = {}
        for p in (q for q in points if q.workload == workload and q.load is not None):
            assert p.load is not None
            for s in p.summaries:
                if s.system == FLOOR:
                    floor.setdefault(p.profile, []).append((p.load, s.mean_ttft))
                elif s.mean_ttft == s.mean_ttft:
                    series.setdefault(p.profile, {}).setdefault(s.system, []).append((p.load, s.mean_ttft))
        path = out_dir / "plots" / f"{workload}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        plots.ttft_vs_load(path, workload, series, floor)
        written.append(path)
    return written


def runs_so_far(out_dir: Path, command: str, wall_s: float) -> list[dict[str, object]]:
    """The runs whose results are on disk: those summary.json listed (the last RUNS_KEPT) plus this one."""
    path = out_dir / "summary.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    runs = list(
        doc.get("runs")
        or ([{"command": doc["command"], "wall_s": doc["wall_s"]}] if "command" in doc else [])
    )
    now = {
        "command": command,
        "wall_s": round(wall_s, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return [*runs, now][-RUNS_KEPT:]


def write_summary(out_dir: Path, readme_path: Path | None, command: str, wall_s: float) -> str:
    points = collect(out_dir)
    rows = [r for r in (row(p) for p in points) if r is not None]
    md = table(rows)
    runs = runs_so_far(out_dir, command, wall_s)
    (out_dir / "summary.md").write_text(md + "\n")
    doc = {"runs": runs, "rows": [asdict(r) for r in rows]}
    (out_dir / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot_paths = write_plots(out_dir, points)
    if readme_path is not None:
        readme.update(readme_path, runs, md, plot_paths, points)
    return md
