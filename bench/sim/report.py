"""The reports of a simulator run: a markdown table, a JSON summary and a PNG of the ratios.

From the scenarios' summaries (``ScenarioResult.summary``), under the output directory:

- ``summary.md``: the geometric mean of kvroute's ratios over the set (mean and p99 TTFT, kvroute / best
  other non-oracle system), then one row per scenario: each system's mean and p99 TTFT, the ratios
  and who the best other was, kvroute's idle-while-queued seconds and smallest replica share; then the
  worst scenarios (highest mean ratio) and the scenarios where some system left a replica below 5% of
  the requests while it sat idle as others queued;
- ``summary.json``: the same figures, exact;
- ``ratios.png``: the per-scenario ratios, sorted, as bars on a log axis with 1.0 marked (below 1:
  kvroute wins).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.sim.system import KVROUTE, ORACLE

WORST = 10


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(math.fsum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def set_summary(
    name: str, command: str, systems: Sequence[str], rows: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "set": name,
        "command": command,
        "systems": list(systems),
        "scenarios_run": len(rows),
        "geomean_ratio_mean": geomean([r["ratio_mean"] for r in rows]),
        "geomean_ratio_p99": geomean([r["ratio_p99"] for r in rows]),
        "kvroute_wins_mean": sum(r["ratio_mean"] < 1.0 for r in rows),
        "scenarios": list(rows),
    }


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    plot_ratios(summary["scenarios"], out / "ratios.png")


def _f(x: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(x) else f"{x:.{digits}f}"


def headline(summary: dict[str, Any]) -> list[str]:
    n = summary["scenarios_run"]
    return [
        "| set | scenarios | geomean ratio (mean TTFT) | geomean ratio (p99 TTFT) | kvroute wins (mean) |",
        "|---|---|---|---|---|",
        f"| {summary['set']} | {n} | {_f(summary['geomean_ratio_mean'], 3)} |"
        f" {_f(summary['geomean_ratio_p99'], 3)} | {summary['kvroute_wins_mean']}/{n} |",
    ]


def markdown(summary: dict[str, Any]) -> str:
    systems: list[str] = summary["systems"]
    rows: list[dict[str, Any]] = summary["scenarios"]
    lines = [f"# kvroute simulator: {summary['set']} set", "", f"    {summary['command']}", ""]
    lines += [
        *headline(summary),
        "",
        "ratio = kvroute (cost) / best other non-oracle system (< 1: wins).",
        "",
    ]
    lines += ["## Systems", "", *_system_table(rows, systems), ""]
    lines += ["## Scenarios", "", *_scenario_table(rows, systems), ""]
    lines += ["## Worst scenarios (highest mean ratio)", "", *_worst_table(rows), ""]
    lines += ["## A replica below 5% of the requests while others queued", "", *_starved_table(rows), ""]
    return "\n".join(lines)


def _system_table(rows: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    """Per system: in how many scenarios it had the lowest mean TTFT of the non-oracle systems, the
    geometric mean of its mean TTFT over kvroute's, its median idle-while-queued seconds, and in how many
    scenarios it left a replica starved (below 5% of the requests while idle as others queued)."""
    head = "| system | best mean TTFT (non-oracle) | geomean mean TTFT / kvroute's | median idle-while-queued"
    out = [head + " s | scenarios with a starved replica |", "|---|---|---|---|---|"]
    for s in systems:
        ran = [r for r in rows if s in r["systems"]]
        best = sum(s != ORACLE and _best(r) == s for r in ran)
        ours = [r for r in ran if KVROUTE in r["systems"]]
        rel = geomean([r["systems"][s]["mean_s"] / r["systems"][KVROUTE]["mean_s"] for r in ours])
        idle = sorted(r["systems"][s]["idle_while_queued_s"] for r in ran)
        starved = sum(bool(r["systems"][s]["starved"]) for r in ran)
        median = idle[len(idle) // 2] if idle else math.nan
        best_cell = str(best) if s != ORACLE else "-"
        out.append(f"| {s} | {best_cell} | {_f(rel, 3)} | {_f(median, 1)} | {starved}/{len(ran)} |")
    return out


def _best(row: dict[str, Any]) -> str:
    others = {s: x["mean_s"] for s, x in row["systems"].items() if s != ORACLE}
    return min(others, key=lambda s: others[s]) if others else ""


def _scenario_table(rows: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    head = ["seed", "kind", "replicas", "load", *(f"{s} mean/p99 s" for s in systems), "floor mean s"]
    head += ["ratio", "p99 ratio", "best other", "kvroute idle-while-queued s", "kvroute min share"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["seed"]), r["kind"], str(r["replicas"]), _f(r["load"])]
        for s in systems:
            x = r["systems"].get(s)
            cells.append(f"{_f(x['mean_s'])} / {_f(x['p99_s'])}" if x else "-")
        ours = r["systems"].get(KVROUTE, {})
        idle, share = ours.get("idle_while_queued_s", math.nan), ours.get("min_share", math.nan)
        cells += [_f(r["floor"]["mean_s"]), _f(r["ratio_mean"]), _f(r["ratio_p99"]), r["best_other"] or "-",
                  _f(idle, 1), _f(share, 3)]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return out


def _worst_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    worst = sorted((r for r in rows if math.isfinite(r["ratio_mean"])), key=lambda r: -r["ratio_mean"])[
        :WORST
    ]
    out = ["| seed | scenario | ratio | p99 ratio | best other | kvroute mean s | oracle mean s |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in worst:
        ours = r["systems"].get(KVROUTE, {}).get("mean_s", math.nan)
        oracle = r["systems"].get(ORACLE, {}).get("mean_s", math.nan)
        out.append(
            f"| {r['seed']} | {r['description']} | {_f(r['ratio_mean'])} | {_f(r['ratio_p99'])} |"
            f" {r['best_other']} | {_f(ours)} | {_f(oracle)} |"
        )
    return out


def _starved_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = ["| seed | system | replicas (share, idle-while-queued s) |", "|---|---|---|"]
    for r in rows:
        for system, x in r["systems"].items():
            if x["starved"]:
                idle = x["idle_while_queued_by_replica"]
                cells = ", ".join(
                    f"{rid.rsplit('-', 1)[-1]} ({x['shares'][rid]:.3f}, {idle[rid]:.1f})"
                    for rid in x["starved"]
                )
                out.append(f"| {r['seed']} | {system} | {cells} |")
    return out if len(out) > 2 else [*out, "| - | none | - |"]


def plot_ratios(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = sorted((r for r in rows if math.isfinite(r["ratio_mean"])), key=lambda r: r["ratio_mean"])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(ranked) + 2.0), 4.0))
    xs = range(len(ranked))
    ax.bar([x - 0.2 for x in xs], [r["ratio_mean"] for r in ranked], width=0.4, label="mean TTFT ratio")
    ax.bar([x + 0.2 for x in xs], [r["ratio_p99"] for r in ranked], width=0.4, label="p99 TTFT ratio")
    ax.axhline(1.0, color="black", linewidth=1.0)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [str(r["seed"]) for r in ranked], rotation=90, fontsize=6)
    ax.set_xlabel("scenario seed (sorted by mean ratio)")
    ax.set_ylabel("kvroute / best other (log)")
    ax.set_title("kvroute (cost) against the best other non-oracle system; below 1: kvroute wins")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
