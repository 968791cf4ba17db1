"""The overhead bench's report: ``overhead[-LABEL].json``, the markdown table ``overhead[-LABEL].md`` and the
plot ``overhead[-LABEL].png`` (matplotlib, Agg backend).

Table cells give the median over runs, then each run's value in parentheses (when there is more than one
run). The ``direct`` row gives the replica's own figures (p50, req/s, the replica's CPU per request); the
routers' rows what they add. The last two columns hold the issue's target beside kvroute's figures and
whether the median meets it (PASS / MISS; n/a when a figure could not be measured, e.g. ``kept`` vs
sglang-router with ``--no-router``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.overhead.figures import DIRECT, Row, Verdict
from bench.overhead.plot import plot
from bench.overhead.requests import Result

Format = Callable[[float], str]


def signed(x: float) -> str:
    return "" if math.isnan(x) else f"{x:+.2f}"


def plain(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.2f}"


def whole(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.0f}"


def cell(row: Row, figure: str, fmt: Format) -> str:
    values = row.per_run[figure]
    if all(math.isnan(v) for v in values):
        return ""
    runs = f" ({', '.join(fmt(v) or 'n/a' for v in values)})" if len(values) > 1 else ""
    return fmt(row.median(figure)) + runs


def verdict_text(v: Verdict) -> str:
    fmt = plain if v.goal.figure == "kept_vs_peer" else signed
    unit = "x" if v.goal.figure == "kept_vs_peer" else " ms"
    word = {True: "PASS", False: "MISS", None: "n/a"}[v.met]
    return f"{word} ({fmt(v.value) or 'n/a'}{unit if not math.isnan(v.value) else ''})"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| case | conc | target | n | err | p50 ms | added p50 ms | added p99 ms | req/s | kept vs direct "
        "| CPU ms/req | issue target (kvroute) | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        routed = r.target != DIRECT
        verdicts = r.verdicts()
        added = [cell(r, f, signed) if routed else "" for f in ("added_p50_ms", "added_p99_ms")]
        cells = [
            r.case, str(r.concurrency), r.target, str(r.requests), str(r.errors), cell(r, "p50_ms", plain),
            *added, cell(r, "rps", whole), cell(r, "kept", plain) if routed else "", cell(r, "cpu_ms", plain),
            "; ".join(v.goal.describe() for v in verdicts), "; ".join(verdict_text(v) for v in verdicts),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline(rows: Sequence[Row]) -> list[str]:
    """One line per issue target: kvroute's median, the target, the verdict."""
    return [
        f"- {r.case}, concurrency {r.concurrency}: {v.goal.describe()}: {verdict_text(v)}"
        for r in rows
        for v in r.verdicts()
    ]


def no_nan(value: Any) -> Any:
    """``value`` with every NaN float replaced by None (JSON has no NaN): a figure not measured."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [no_nan(v) for v in value]
    return value


def stem(label: str) -> str:
    return f"overhead-{label}" if label else "overhead"


def markdown(meta: Mapping[str, Any], rows: Sequence[Row]) -> str:
    loads = ", ".join(f"{r['load_average_1m_start']} -> {r['load_average_1m']}" for r in meta["runs"])
    head = [
        f"# Gateway overhead{' (' + str(meta['label']) + ')' if meta.get('label') else ''}",
        "",
        f"`{meta['command']}`: {meta['runs_done']} runs, {meta['cores']} cores, {meta['wall_s']} s; "
        f"load average (1 min) at the start and end of each run: {loads}. kvroute: `{meta['kvroute']}`; "
        f"sglang-router {meta['sglang_router']} (cache_aware).",
        "",
        "Medians over runs, each run's value in parentheses; added = the target's percentile minus direct's "
        "in the same run; kept = req/s over direct's; CPU = the target process tree's CPU ms per request "
        "(direct: the replica's). Method: docs/benchmarks.md.",
        "",
    ]
    return (
        "\n".join([*head, table(rows), "", "Issue 40's targets (kvroute's medians):", "", *headline(rows)])
        + "\n"
    )


def write(out: Path, meta: Mapping[str, Any], rows: Sequence[Row], runs: Sequence[Sequence[Result]]) -> str:
    """Writes the JSON, the markdown and the plot under ``out``; returns the markdown."""
    name = stem(str(meta.get("label") or ""))
    doc = {"meta": meta, "rows": [r.doc() for r in rows], "runs": [[asdict(x) for x in run] for run in runs]}
    (out / f"{name}.json").write_text(json.dumps(no_nan(doc), indent=2))
    md = markdown(meta, rows)
    (out / f"{name}.md").write_text(md)
    plot(out / f"{name}.png", rows, str(meta.get("label") or ""))
    return md
