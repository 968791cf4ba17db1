"""The soak's table and plot (``bench.labs.soak``): samples of the gateway's RSS and fds, outcome counts."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BASELINE_SAMPLES = 3  # the first samples after the warm-up; the end is the mean of the last ones


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    rss_kib: int
    fds: int
    requests: int


def _ends(samples: Sequence[Sample], warmup_s: float) -> tuple[list[Sample], list[Sample]]:
    warm = [s for s in samples if s.t_s >= warmup_s] or list(samples)
    return warm[:BASELINE_SAMPLES], warm[-BASELINE_SAMPLES:]


def _change(before: float, after: float) -> str:
    return f"{(after - before) / before * 100:+.1f}%" if before else "n/a"


def _faults(log: Sequence[str]) -> str:
    """``fail: 8, reset: 8, ...`` from the soak's fault log (``action@port:status``)."""
    counts = Counter(entry.split("@")[0] for entry in log if entry.endswith(":200"))
    refused = sum(not entry.endswith(":200") for entry in log)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + (
        f" ({refused} refused)" if refused else ""
    )


def table(args: argparse.Namespace, outcomes: Counter[str], samples: Sequence[Sample],
          faults: Sequence[str], alive: bool) -> str:  # fmt: skip
    first, last = _ends(samples, args.warmup)
    rss0, rss1 = mean(s.rss_kib for s in first) / 1024, mean(s.rss_kib for s in last) / 1024
    fd0, fd1 = mean(s.fds for s in first), mean(s.fds for s in last)
    kinds = sorted(k for k in outcomes if k not in ("requests", "ok", "lost"))
    lines = [
        "# Soak (`python -m bench.labs.soak`)",
        "",
        f"`python -m bench.labs.soak --minutes {args.minutes:g}`: {args.workers} clients (agent turns, RAG "
        f"questions, streams, client disconnects) through one `kvroute serve --state redis://` over 4 "
        f"emulated replicas, {len(faults)} faults injected (every {args.fault_every:g} s: fail 503, "
        "cut_stream, reset, slow, restart, in turn over the replicas).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| requests | {outcomes['requests']} |",
        f"| ok | {outcomes['ok']} |",
        *(f"| {k} | {outcomes[k]} |" for k in kinds),
        f"| lost requests (no answer, or a body that never ended) | **{outcomes['lost']}** |",
        f"| gateway RSS after warm-up ({args.warmup:g} s) → end | {rss0:.1f} → {rss1:.1f} MiB "
        f"({_change(rss0, rss1)}) |",
        f"| gateway open fds after warm-up → end | {fd0:.0f} → {fd1:.0f} ({_change(fd0, fd1)}) |",
        f"| gateway still running at the end | {'yes' if alive else '**no**'} |",
        f"| faults injected (action: count) | {_faults(faults)} |",
        "",
        "Outcomes: `sse_error` is a stream cut by a replica after its first byte that ended with "
        "kvroute's SSE error event (the promised behaviour); `disconnect` is a client leaving on purpose; "
        "`<status> kvroute|replica` is an error answer and who made it. Baseline and end are the means of "
        f"the first and last {BASELINE_SAMPLES} samples after the warm-up (one every "
        f"{args.sample_every:g} s); plot: `soak.png`.",
    ]
    return "\n".join(lines) + "\n"


def plot(path: Path, samples: Sequence[Sample], warmup_s: float) -> None:
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    ts = [s.t_s for s in samples]
    a.plot(ts, [s.rss_kib / 1024 for s in samples], label="RSS (MiB)")
    b.plot(ts, [s.fds for s in samples], label="open fds", color="tab:orange")
    for ax, label in ((a, "gateway RSS (MiB)"), (b, "gateway open fds")):
        ax.axvline(warmup_s, linestyle="--", color="grey", label="end of warm-up")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    b.set_xlabel("seconds")
    a.set_title("kvroute soak: memory and file descriptors")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
