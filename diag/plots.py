"""PNG plots of the diagnostics (``--plot PATH``), with matplotlib's Agg backend (no display needed).

matplotlib comes with the ``bench`` extra; probe.py and ab.py import this module only when ``--plot``
is given, so the commands work without it.

- probe: one bar per timed send of R (cold, after eviction, again), TTFT on a log axis, with seed 1's
  write_back times scaled to this run's cold TTFT (x 1, x 0.026, x 0.0065) as black ticks: a bar far
  above its tick is a tier that did not serve R;
- ab: per URL, the median cold and hot TTFT as grouped bars on a log axis (seed 2's chart: shorter is
  better), each bar labelled with its value.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from diag.client import DiagError
from diag.report import SEED_RATIOS

if TYPE_CHECKING:
    from diag.results import AbResult, ProbeResult


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise DiagError(f"cannot write the plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def _label(ax: Axes, xs: list[float], values: list[float]) -> None:
    for x, v in zip(xs, values, strict=True):
        ax.annotate(f"{v:.3g} s", (x, v), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8)


def probe_png(r: ProbeResult, path: Path) -> None:
    names = ["R cold", "R after eviction", "R again"]
    ttfts = [r.cold.ttft_s, r.after.ttft_s, r.again.ttft_s]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [float(i) for i in range(len(names))]
    ax.bar(xs, ttfts, color=["tab:gray", "tab:orange", "tab:green"])
    ax.scatter(xs, [r.cold.ttft_s * s for s in SEED_RATIOS], marker="_", s=900, color="black", zorder=3,
               label="seed 1 (write_back), scaled to this cold TTFT")  # fmt: skip
    _label(ax, xs, ttfts)
    ax.set_xticks(xs, names)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, log scale)")
    ax.set_title(f"kvroute probe {r.pool.replica}: {r.verdict.outcome}", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    _save(fig, path)


def ab_png(results: list[AbResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(max(6.0, 3.0 * len(results)), 4.5))
    xs = [float(i) for i in range(len(results))]
    for offset, phase, color in ((-0.2, "cold", "tab:gray"), (0.2, "hot", "tab:green")):
        values = [(r.cold if phase == "cold" else r.hot).median for r in results]
        at = [x + offset for x in xs]
        ax.bar(at, values, width=0.4, color=color, label=f"{phase} (median of {results[0].runs})")
        _label(ax, at, values)
    ax.set_xticks(xs, [f"{r.target.url}\n{r.target.pools[0].describe().split(',')[0]}" for r in results])
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, log scale; shorter is better)")
    ax.set_title(f"kvroute ab: {results[0].prompt_tokens:,}-token prompt, cold vs hot", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)
