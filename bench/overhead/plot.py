"""The overhead bench's plot (matplotlib, Agg backend: no display needed), three panels side by side:

1. added latency per case, at concurrency 1: the figures the issue judges (small chat p50 and p99, the
   stream's p99, the repeated 40K prompt's p50) and the unique 40K prompts' p50;
2. requests/s kept vs direct at the higher concurrencies;
3. CPU ms per request of each router's process tree, per case.

One bar per router (the median over runs) with each run's value as a black dot; a red dash over kvroute's
bar marks the issue's target where there is one (for ``kept``: 0.8x sglang-router's median).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.overhead.figures import DIRECT, KVROUTE, PEER, Row

SHORT = {"added_p50_ms": "p50", "added_p99_ms": "p99", "kept": "kept", "cpu_ms": "CPU"}
Group = tuple[str, int, str]  # case, concurrency, figure


def latency_groups(rows: Sequence[Row]) -> list[Group]:
    """(case, 1, figure) for each latency figure a case at concurrency 1 is judged on (else its p50)."""
    out: list[Group] = []
    for r in rows:
        if r.concurrency != 1 or r.target != DIRECT:
            continue
        judged = [g.figure for g in r.goals if g.figure.startswith("added")] or ["added_p50_ms"]
        out += [(r.case, 1, f) for f in judged]
    return out


def _goal(rows: Sequence[Row], group: Group) -> float:
    case, conc, figure = group
    for r in rows:
        if (r.case, r.concurrency) != (case, conc) or r.target != KVROUTE:
            continue
        for g in r.goals:
            if g.figure == figure:
                return g.bound
            if g.figure == "kept_vs_peer" and figure == "kept":
                peer = [p for p in rows if (p.case, p.concurrency, p.target) == (case, conc, PEER)]
                return g.bound * peer[0].median("kept") if peer else math.nan
    return math.nan


def _bars(ax: Axes, rows: Sequence[Row], groups: Sequence[Group], ylabel: str) -> None:
    routers = list(dict.fromkeys(r.target for r in rows if r.target != DIRECT))
    by = {(r.case, r.concurrency, r.target): r for r in rows}
    width = 0.8 / max(1, len(routers))
    for k, target in enumerate(routers):
        for g, (case, conc, figure) in enumerate(groups):
            row = by.get((case, conc, target))
            if row is None:
                continue
            x = g + (k - (len(routers) - 1) / 2) * width
            ax.bar(x, row.median(figure), width, color=f"C{k}", label=target if g == 0 else None)
            ax.plot([x] * len(row.per_run[figure]), row.per_run[figure], "k.", markersize=4)
            bound = _goal(rows, (case, conc, figure)) if target == KVROUTE else math.nan
            if not math.isnan(bound):
                ax.plot([x - width / 2, x + width / 2], [bound, bound], "r-", linewidth=2)
    names = [f"{textwrap.fill(case, 16)}\nc={conc} {SHORT[figure]}" for case, conc, figure in groups]
    ax.set_xticks(range(len(groups)), names, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def plot(path: Path, rows: Sequence[Row], label: str = "") -> None:
    cases = list(dict.fromkeys((r.case, r.concurrency) for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [5, 2, 6]})
    _bars(axes[0], rows, latency_groups(rows), "added latency over direct, ms")
    _bars(axes[1], rows, [(c, n, "kept") for c, n in cases if n > 1], "req/s kept vs direct")
    _bars(axes[2], rows, [(c, n, "cpu_ms") for c, n in cases], "router CPU ms per request")
    title = "Gateway overhead on a zero-latency emulated replica: medians (bars), runs (dots), targets (red)"
    fig.suptitle(title + (f" [{label}]" if label else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
