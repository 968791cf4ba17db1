"""The reports of ``kvroute bench sim --real``: comparison.md, comparison.json and comparison.png.

``comparison.md``: the set's lines (geomean of kvroute's real and simulated ratios, the worst real ratio,
how many scenarios are within 10% and ranked alike, the issue's targets met or not); per system, its real
mean TTFT over its simulated one across the scenarios; then one row per scenario: each system's mean /
p99 TTFT real and simulated, the ratios, within 10%, ranked alike, kvroute's idle-while-queued seconds
real and simulated, the time scale and wall time; then the notes (errors, fleet changes a router
refused). ``comparison.json``: the same, exact. ``comparison.png``: per scenario kvroute's ratio real
beside simulated, on a log axis with 1.0 marked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.confirm.comparison import TOLERANCE


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "comparison.md").write_text(markdown(summary))
    plot(summary["scenarios"], out / "comparison.png")


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def headline(s: dict[str, Any]) -> list[str]:
    n = s["scenarios_run"]
    return [
        "| set | scenarios | real geomean ratio | sim geomean ratio | worst real ratio (seed) |"
        " within 10% | ranked alike |",
        "|---|---|---|---|---|---|---|",
        f"| {s['set']} | {n} | {_f(s['geomean_ratio_real'], 3)} | {_f(s['geomean_ratio_sim'], 3)} |"
        f" {_f(s['worst_ratio_real'], 3)} ({s['worst_seed']}) | {s['within_count']}/{n} |"
        f" {s['ranked_alike_count']}/{n} |",
    ]


def markdown(s: dict[str, Any]) -> str:
    lines = [f"# kvroute simulator confirmed on real runs: {s['set']}", "", f"    {s['command']}", ""]
    lines += [
        *headline(s),
        "",
        "ratio = kvroute (cost) / best other system by mean TTFT (< 1: kvroute wins);",
    ]
    lines += [f"within = |real ratio / sim ratio - 1| <= {TOLERANCE:.2f}; TTFTs in modelled seconds.", ""]
    lines += ["Targets:", "", *(f"- {k}: {'met' if v else 'NOT met'}" for k, v in s["targets"].items()), ""]
    lines += ["## Each system, real against simulated", "", *system_table(s["scenarios"], s["systems"]), ""]
    lines += ["## Scenarios", "", *scenario_table(s["scenarios"], s["systems"]), ""]
    lines += ["## Notes", "", *_notes(s["scenarios"]), ""]
    return "\n".join(lines)


def system_table(rows: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    """Per system, its real mean TTFT over its simulated one in each scenario: their geometric mean, the
    range, and in how many scenarios it is within the tolerance. A system far off while round robin
    (whose choices depend on nothing the simulator models) is close points at that system's model."""
    out = ["| system | real / sim mean TTFT, geomean | range | within 10% |", "|---|---|---|---|"]
    for x in systems:
        q = [r["real"][x]["mean_s"] / r["sim"][x]["mean_s"] for r in rows if _both(r, x)]
        if q:
            within = sum(abs(v - 1.0) <= TOLERANCE for v in q)
            gm = math.exp(sum(map(math.log, q)) / len(q))
            out.append(f"| {x} | {gm:.2f} | {min(q):.2f}-{max(q):.2f} | {within}/{len(q)} |")
    return out


def _both(row: dict[str, Any], system: str) -> bool:
    real, sim = row["real"].get(system), row["sim"].get(system)
    return bool(real and sim and real["mean_s"] > 0 and sim["mean_s"] > 0)


def scenario_table(rows: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    head = ["seed", *(f"{x} real / sim mean·p99 s" for x in systems), "ratio real", "ratio sim"]
    head += ["within 10%", "ranked alike", "kvroute idle-while-queued s real / sim", "scale", "wall s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["seed"]), *(_pair(r, x) for x in systems)]
        cells += [f"{_f(r['ratio_real'], 3)} ({r['best_other_real'] or '-'})",
                  f"{_f(r['ratio_sim'], 3)} ({r['best_other_sim'] or '-'})",
                  "yes" if r["within"] else "no", "yes" if r["ranked_alike"] else "no",
                  _idle(r), f"{r['scale']:g}", _f(r["wall_s"], 0)]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return out


def _pair(row: dict[str, Any], system: str) -> str:
    real, sim = row["real"].get(system), row["sim"].get(system)
    a = f"{_f(real['mean_s'])}·{_f(real['p99_s'])}" if real else "-"
    b = f"{_f(sim['mean_s'])}·{_f(sim['p99_s'])}" if sim else "-"
    return f"{a} / {b}"


def _idle(row: dict[str, Any]) -> str:
    real = row["real"].get("cost", {}).get("idle_while_queued_s")
    sim = row["sim"].get("cost", {}).get("idle_while_queued_s")
    return f"{_f(real, 1)} / {_f(sim, 1)}"


def _notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [f"- {r['description']}" for r in rows]
    for r in rows:
        out += [f"- seed {r['seed']}: {note}" for note in r.get("notes", [])]
        if not r["ranked_alike"]:
            out.append(f"- seed {r['seed']}: ranked {' < '.join(r['rank_real'])} for real, "
                       f"{' < '.join(r['rank_sim'])} in the simulator")  # fmt: skip
    return out


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2.0), 4.0))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [_bar(r["ratio_real"]) for r in rows], width=0.4, label="real")
    ax.bar([x + 0.2 for x in xs], [_bar(r["ratio_sim"]) for r in rows], width=0.4, label="simulated")
    ax.axhline(1.0, color="black", linewidth=1.0)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [str(r["seed"]) for r in rows], rotation=90, fontsize=7)
    ax.set_xlabel("scenario seed")
    ax.set_ylabel("kvroute / best other (mean TTFT, log)")
    ax.set_title(
        "kvroute / best other, real runs and the simulator\n(below 1: kvroute is faster)", fontsize=10
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bar(x: float) -> float:
    return x if math.isfinite(x) and x > 0 else 1.0
