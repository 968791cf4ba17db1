"""The prefill/decode benchmark's report (bench/pd.py): its table, its targets, its plot, its files.

One ``PdPoint`` per (workload, load): the ``Summary`` of every system there (``bench.reports.tables``).
The table gives each system's mean TTFT (modelled s, from arrival) and kvroute-pd's ratio to each other
system; the hit ratio is token-weighted (cached / prompt tokens, as the decode reported them: the prefill's
figures, pd-contract.md §2.5). Targets (issue 41), each judged on this one run:

- sglang-router's PD mode serves the workloads through the emulated PD fleet (no errors);
- kvroute-pd's mean TTFT <= 0.6x sglang-router PD cache_aware's on rag and agent, and <= 1.0x on every
  workload at every load;
- a repeated ~2K-token prompt is >= 90% cached on its prefill (``Repeat``);
- the same GPUs run unified (4 unified replicas under kvroute) are reported beside;
- a decode server killed mid-run loses 0 requests that had not started streaming (``Kill``).

Files: OUT/pd.md (tables, targets), OUT/pd.json, OUT/pd.png (mean TTFT against load per workload; the
closed-loop agent at its own pace as bars).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.reports.tables import Summary

SUBJECT, CACHE_AWARE, ROUND_ROBIN, UNIFIED = (
    "kvroute-pd",
    "sglang-pd-cache_aware",
    "sglang-pd-round_robin",
    "kvroute-unified",
)
SYSTEMS = (SUBJECT, CACHE_AWARE, ROUND_ROBIN, UNIFIED)
STRICT = ("rag", "agent")  # <= 0.6x there
STRICT_RATIO, ANY_RATIO, CACHED_TARGET = 0.6, 1.0, 0.9


@dataclass(frozen=True, slots=True)
class PdPoint:
    workload: str
    load: float | None  # None: own pace (closed loop)
    summaries: dict[str, Summary]
    skipped: dict[str, str]

    @property
    def label(self) -> str:
        return "own pace" if self.load is None else f"{self.load:g}"

    def ratio(self, other: str) -> float:
        me, them = self.summaries.get(SUBJECT), self.summaries.get(other)
        if me is None or them is None or not them.mean_ttft > 0:
            return float("nan")
        return me.mean_ttft / them.mean_ttft


@dataclass(frozen=True, slots=True)
class Repeat:
    """Repeated ~2K-token prompts through a system: cached / prompt tokens of each second send."""

    system: str
    prompts: int
    prompt_tokens: int  # mean, of the second sends
    cached_fraction: float  # sum cached / sum prompt tokens over the second sends
    worst: float  # the lowest single second send's fraction


@dataclass(frozen=True, slots=True)
class Kill:
    """kvroute-pd on a workload whose decode server #1 was SIGKILLed at ``at_s`` (modelled s)."""

    workload: str
    load: float
    at_s: float
    requests: int
    ok: int
    lost_before_streaming: int  # failed with no content byte (the target: 0)
    cut_while_streaming: int  # failed after content began (one SSE error event)
    unsent: int  # never sent: the replay's deadline came first (not a loss of the system)
    retried: int = 0  # pair attempts retried on the other decode server (kvroute_pd_pair_failures_total)


def _f(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def main_table(points: Sequence[PdPoint]) -> str:
    head = ["workload", "load", *(f"{s} mean TTFT s" for s in SYSTEMS), "kvroute-pd / sglang-pd cache_aware",
            "kvroute-pd / sglang-pd round_robin", "kvroute-pd / unified",
            "hit ratio kvroute-pd / sglang cache_aware"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        ttft = [_f(p.summaries[s].mean_ttft) if s in p.summaries else "skipped" for s in SYSTEMS]
        me, ca = p.summaries.get(SUBJECT), p.summaries.get(CACHE_AWARE)
        hits = f"{_f(me.hit_ratio, 3)} / {_f(ca.hit_ratio, 3)}" if me and ca else "n/a"
        cells = [p.workload, p.label, *ttft, f"{_f(p.ratio(CACHE_AWARE))}x", f"{_f(p.ratio(ROUND_ROBIN))}x",
                 f"{_f(p.ratio(UNIFIED))}x", hits]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def targets(points: Sequence[PdPoint], repeats: Sequence[Repeat], kill: Kill | None) -> str:
    served = [(p, s) for p in points for name, s in p.summaries.items() if name.startswith("sglang-pd-")]
    errors = sum(s.errors for _, s in served)
    strict = [p for p in points if p.workload in STRICT]
    worst_strict = max((p.ratio(CACHE_AWARE) for p in strict), default=float("nan"))
    worst_any = max((p.ratio(CACHE_AWARE) for p in points), default=float("nan"))
    mine = next((r for r in repeats if r.system == SUBJECT), None)
    requests = sum(s.requests for _, s in served)
    lines = [
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| sglang-router PD serves requests through the emulated PD fleet | {requests} requests, {errors} "
        f"errors | {_verdict(bool(served) and errors == 0)} |",
        f"| kvroute-pd mean TTFT <= {STRICT_RATIO}x sglang-pd cache_aware on rag and agent | worst "
        f"{_f(worst_strict)}x | {_verdict(worst_strict <= STRICT_RATIO)} |",
        f"| kvroute-pd mean TTFT <= {ANY_RATIO}x sglang-pd cache_aware on every workload at every load | "
        f"worst {_f(worst_any)}x | {_verdict(worst_any <= ANY_RATIO)} |",
    ]
    if mine is not None:
        lines.append(
            f"| a repeated ~2K-token prompt >= {CACHED_TARGET:.0%} cached on the prefill | "
            f"{mine.cached_fraction:.1%} over {mine.prompts} prompts (worst {mine.worst:.1%}, "
            f"{mine.prompt_tokens} tokens) | {_verdict(mine.worst >= CACHED_TARGET)} |"
        )
    unified = [p for p in points if UNIFIED in p.summaries]
    lines.append(f"| the same GPUs run unified, reported beside | {len(unified)} of {len(points)} points | "
                 f"{_verdict(len(unified) == len(points))} |")  # fmt: skip
    if kill is not None:
        lines.append(
            f"| a decode server killed mid-run: 0 requests lost that had not started streaming | "
            f"{kill.lost_before_streaming} lost, {kill.cut_while_streaming} cut while streaming, "
            f"{kill.retried} retried on the other decode, {kill.ok} of {kill.requests} ok | "
            f"{_verdict(kill.lost_before_streaming == 0)} |"
        )
    return "\n".join(lines)


def repeats_table(repeats: Sequence[Repeat]) -> str:
    rows = [
        "| system | prompts | mean prompt tokens | cached on the second send | worst |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| {r.system} | {r.prompts} | {r.prompt_tokens} | {r.cached_fraction:.1%} | {r.worst:.1%} |"
        for r in repeats
    ]
    return "\n".join(rows)


def plot(path: Path, points: Sequence[PdPoint]) -> None:
    workloads = list(dict.fromkeys(p.workload for p in points))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.4), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        mine = [p for p in points if p.workload == w]
        swept = [p for p in mine if p.load is not None]
        for system in SYSTEMS:
            if swept:
                xy = sorted(
                    (p.load or 0.0, p.summaries[system].mean_ttft) for p in swept if system in p.summaries
                )
                if xy:
                    ax.plot(*zip(*xy, strict=True), marker="o", label=system)
            else:
                ys = [p.summaries[system].mean_ttft for p in mine if system in p.summaries]
                ax.bar(system.replace("sglang-pd-", "sglang\n"), ys[0] if ys else 0.0)
        ax.set_yscale("log")
        ax.set_title(f"{w}" + ("" if swept else " (own pace, closed loop)"))
        ax.set_ylabel("mean TTFT from arrival (modelled s, log)")
        if swept:
            ax.set_xlabel("offered load (of the 2 prefill servers' capacity)")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(
    out: Path,
    points: Sequence[PdPoint],
    repeats: Sequence[Repeat],
    kill: Kill | None,
    meta: dict[str, object],
) -> str:
    out.mkdir(parents=True, exist_ok=True)
    md = "\n\n".join([
        f"`{meta.get('command', 'python -m bench.pd')}` ({meta.get('date', '')}; {meta.get('size', '')})",
        main_table(points), "Targets:", targets(points, repeats, kill), "Repeated ~2K-token prompts:",
        repeats_table(repeats),
    ])  # fmt: skip
    skipped = [f"- {p.workload} {p.label}: skipped {k}: {v}" for p in points for k, v in p.skipped.items()]
    if skipped:
        md += "\n\n" + "\n".join(skipped)
    (out / "pd.md").write_text(md + "\n")
    doc = {
        "meta": meta,
        "points": [
            {"workload": p.workload, "load": p.load, "skipped": p.skipped,
             "summaries": {k: asdict(s) for k, s in p.summaries.items()}}
            for p in points
        ],
        "repeats": [asdict(r) for r in repeats],
        "kill": asdict(kill) if kill is not None else None,
    }  # fmt: skip
    (out / "pd.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if points:
        plot(out / "pd.png", points)
    return md
