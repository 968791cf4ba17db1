"""PNG plots of one workload's results (matplotlib, Agg backend: no display needed).

- ttft_cdf.png: empirical CDF of TTFT per system (log x axis: cold prefills and GPU hits differ 100x);
- hit_ratio.png: token-weighted cache hit ratio per system;
- load.png: requests served by each replica, per system, busiest first (a tall first bar is a hot spot).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bench.report import Summary
from bench.runner import Record


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft_cdf(path: Path, workload: str, records: Mapping[str, Sequence[Record]]) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, recs in records.items():
        xs = sorted(r.ttft_s for r in recs if r.ok and r.ttft_s is not None)
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=name, linestyle="--" if name == "oracle" else "-")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (modelled seconds, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{workload}: TTFT CDF per system")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.6)
    _save(fig, path)


def hit_ratio(path: Path, workload: str, summaries: Sequence[Summary]) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [s.system for s in summaries]
    ax.bar(names, [s.hit_ratio for s in summaries], color="tab:green")
    ax.set_ylim(0, 1)
    ax.set_ylabel("sum cached / sum prompt tokens")
    ax.set_title(f"{workload}: token-weighted cache hit ratio")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    _save(fig, path)


def load(path: Path, workload: str, summaries: Sequence[Summary]) -> None:
    """Requests per replica, busiest first (each system ran on its own fresh replicas: ranks, not ports)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    n = max((len(s.per_replica) for s in summaries), default=0)
    width = 0.8 / max(1, n)
    for rank in range(n):
        heights = []
        for s in summaries:
            counts = sorted(s.per_replica.values(), reverse=True)
            heights.append(counts[rank] if rank < len(counts) else 0)
        xs = [i + rank * width for i in range(len(summaries))]
        ax.bar(xs, heights, width, label="busiest" if rank == 0 else f"#{rank + 1}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(summaries))])
    ax.set_xticklabels([s.system for s in summaries], rotation=45, fontsize=7, ha="right")
    ax.set_ylabel("requests served")
    ax.set_title(f"{workload}: load per replica (busiest first)")
    ax.legend(fontsize=7)
    _save(fig, path)


def write_all(
    out_dir: Path, workload: str, summaries: Sequence[Summary], records: Mapping[str, Sequence[Record]]
) -> None:
    target = out_dir / workload
    target.mkdir(parents=True, exist_ok=True)
    ttft_cdf(target / "ttft_cdf.png", workload, records)
    hit_ratio(target / "hit_ratio.png", workload, summaries)
    load(target / "load.png", workload, summaries)
