"""PNG plots of the fleet benchmark (matplotlib, Agg backend: no display needed).

Per (point, workload):
- ttft_cdf.png: empirical CDF of TTFT (from scheduled arrival) per system (log x axis: cold prefills
  and GPU hits differ 100x);
- load.png: prefill seconds served by each replica, per system, busiest first (a tall first bar is a
  hot spot; each system ran on its own fresh replicas, so bars are ranks, not ports).
Per workload, over the points (bench/reports/summary.py):
- <workload>.png: mean TTFT against offered load, one line per system, one panel per profile, the floor
  dashed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.reports.tables import Summary
from bench.runs.replay import Record

Series = Mapping[str, Mapping[str, Sequence[tuple[float, float]]]]  # profile -> system -> (load, ttft)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _label(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.6)


def ttft_cdf(path: Path, workload: str, records: Mapping[str, Sequence[Record]]) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, recs in records.items():
        xs = sorted(r.ttft_s for r in recs if r.ok and r.ttft_s is not None)
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=name, linestyle="--" if name == "oracle" else "-")
    ax.set_xscale("log")
    _label(ax, f"{workload}: TTFT CDF per system", "TTFT from scheduled arrival (modelled s, log scale)",
           "fraction of requests")  # fmt: skip
    _save(fig, path)


def load(path: Path, workload: str, summaries: Sequence[Summary]) -> None:
    """Prefill seconds per replica, busiest first."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    n = max((len(s.work_per_replica) for s in summaries), default=0)
    width = 0.8 / max(1, n)
    for rank in range(n):
        heights = []
        for s in summaries:
            values = sorted(s.work_per_replica.values(), reverse=True)
            heights.append(values[rank] if rank < len(values) else 0.0)
        xs = [i + rank * width for i in range(len(summaries))]
        ax.bar(xs, heights, width, label="busiest" if rank == 0 else f"#{rank + 1}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(summaries))])
    ax.set_xticklabels([s.system for s in summaries], rotation=45, fontsize=7, ha="right")
    ax.set_ylabel("prefill seconds served (modelled)")
    ax.set_title(f"{workload}: prefill work per replica (busiest first)")
    ax.legend(fontsize=7)
    _save(fig, path)


def write_all(
    target: Path, workload: str, summaries: Sequence[Summary], records: Mapping[str, Sequence[Record]]
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    ttft_cdf(target / "ttft_cdf.png", workload, records)
    load(target / "load.png", workload, summaries)


def ttft_vs_load(
    path: Path, workload: str, series: Series, floor: Mapping[str, Sequence[tuple[float, float]]]
) -> None:
    """Mean TTFT against offered load per system; one panel per profile; `floor` per profile, dashed."""
    profiles = list(series)
    fig, axes = plt.subplots(1, len(profiles), figsize=(6.5 * len(profiles), 4.8), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        for system, points in series[profile].items():
            xs, ys = zip(*sorted(points), strict=True)
            style = "--" if system == "oracle" else "-"
            ax.plot(xs, ys, style, marker="o", label=system)
        if floor.get(profile):
            xs, ys = zip(*sorted(floor[profile]), strict=True)
            ax.plot(xs, ys, ":", color="black", marker="x", label="floor")
        ax.set_yscale("log")
        loads = [x for points in series[profile].values() for x, _ in points]
        ax.set_xlim(0.0, max(1.0, *loads) + 0.05)  # one scale for every panel, even with one load
        xlabel = "offered load (fraction of the fleet's prefill capacity)"
        _label(ax, f"{workload}, profile {profile}", xlabel, "mean TTFT from arrival (modelled s, log scale)")
    _save(fig, path)
