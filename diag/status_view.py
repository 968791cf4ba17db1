"""A kvroute gateway's ``/status`` document as plain text: what the status page shows, for a terminal.

    kvroute status  http://127.0.0.1:8000  policy cost  2/2 replicas healthy  models emu-model  12:00:01

    http://127.0.0.1:30001  healthy  emu-model  HiCache write_back  scraped 0.4 s ago
      view     exact · model error 0.1% over 42 requests
      load     3 in flight · prefill queued 1.20 s (6,016 tok) · utilization 41% · replica: 2 running, …
      gpu      model [######----------]  38%   replica [#######---------]  44%
      host     model [##--------------]  12%   replica [##--------------]  13%
      storage  model –
      hit      gateway 71% · replica: device 52% · host 19% · storage 0%
      ttft     ▁▁▂▁▇▁▁▂  last 120 ms · median 95 ms

Then the recent decisions (newest first, at most ``DECISIONS`` lines), the warnings, and the warm-up
section when the gateway reports one: a summary line and a table of its documents (at most
``WARM_ROWS``). Fill bars: ``#`` per 1/16 of the tier (model = kvroute's cache
model, tokens / capacity; replica = what its own /metrics reports). Sparklines: one of ``▁▂▃▄▅▆▇█`` per
TTFT, scaled between the smallest and the largest shown. Pure: a dict in, a string out.
"""

from __future__ import annotations

import time
from typing import Any

BAR_CELLS = 16
SPARKS = "▁▂▃▄▅▆▇█"
DECISIONS = 12
WARM_ROWS = 20  # documents listed in the warm-up table (the rest counted)
SPARK_POINTS = 40


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def pct(x: Any) -> str:
    return f"{100 * x:.0f}%" if _num(x) else "–"


def secs(x: Any) -> str:
    if not _num(x):
        return "–"
    return f"{1000 * x:.0f} ms" if x < 1 else f"{x:.2f} s"


def tokens(x: Any) -> str:
    return f"{round(x):,}" if _num(x) else "–"


def bar(ratio: Any) -> str:
    if not _num(ratio):
        return "–"
    filled = round(max(0.0, min(1.0, ratio)) * BAR_CELLS)
    return f"[{'#' * filled}{'-' * (BAR_CELLS - filled)}] {pct(ratio):>4}"


def sparkline(values: list[float]) -> str:
    xs = values[-SPARK_POINTS:]
    if not xs:
        return ""
    low, span = min(xs), (max(xs) - min(xs)) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((x - low) / span * len(SPARKS)))] for x in xs)


def _health(r: dict[str, Any]) -> str:
    return "unhealthy" if not r.get("healthy") else "draining" if r.get("draining") else "healthy"


def _scraped(rep: dict[str, Any]) -> str:
    if _num(rep.get("age_s")):
        return f"scraped {secs(rep['age_s'])} ago"
    return "no /metrics" if rep.get("enabled") is False else "not scraped yet"


def _fill(tier: str, r: dict[str, Any]) -> str:
    model = (r.get("cache_model") or {}).get(tier) or {}
    g = (r.get("reported") or {}).get("gauges") or {}
    line = f"  {tier:<8} model {bar(model.get('fill'))}"
    if tier == "gpu" and _num(g.get("token_usage")):
        line += f"   replica {bar(g['token_usage'])}"
    total: Any = g.get("hicache_host_total_tokens")
    if tier == "host" and _num(total) and total > 0:
        line += f"   replica {bar(g.get('hicache_host_used_tokens', 0) / total)}"
    return line


def _load(r: dict[str, Any]) -> str:
    load, g = r.get("load") or {}, (r.get("reported") or {}).get("gauges") or {}
    line = (
        f"  load     {load.get('inflight_requests', 0)} in flight · prefill queued "
        f"{secs(load.get('queued_prefill_s'))} ({tokens(load.get('queued_prefill_tokens'))} tok) · "
        f"utilization {pct(load.get('utilization'))}"
    )
    if _num(g.get("num_running_reqs")):
        line += f" · replica: {g['num_running_reqs']:.0f} running, {g.get('num_queue_reqs', 0):.0f} queued"
    return line


def _hit(r: dict[str, Any]) -> str:
    h = r.get("hit_ratio") or {}
    tiers = " · ".join(f"{t} {pct(h[t])}" for t in ("device", "host", "storage") if _num(h.get(t)))
    return f"  hit      gateway {pct(h.get('gateway'))} · replica: {tiers or '–'}"


def _ttft(r: dict[str, Any]) -> str:
    xs = [x for x in r.get("ttft_recent_s") or [] if _num(x)]
    n = r.get("requests_recent") if _num(r.get("requests_recent")) else 0
    if not xs and n:  # only a streamed answer has a TTFT
        return f"  ttft     no TTFT in its last {n} requests (only streamed answers have one)"
    if not xs:
        return "  ttft     no requests yet"
    median = sorted(xs)[len(xs) // 2]
    return f"  ttft     {sparkline(xs)}  last {secs(xs[-1])} · median {secs(median)}"


def _knowledge(k: dict[str, Any] | None) -> str:
    """The gateway's view of the replica: exact, learned or degraded, and why (proxy/sync/knowledge.py)."""
    if not k:
        return "  view     –"
    w = k.get("window") or {}
    err = (
        f" · model error {pct(w['error_ratio'])} over {w.get('requests')} requests"
        if _num(w.get("error_ratio"))
        else ""
    )
    why = f" ({k['reason']})" if k.get("reason") else ""
    return f"  view     {k.get('state', '?')}{why}{err}"


def replica_block(r: dict[str, Any], knowledge: dict[str, Any] | None = None) -> list[str]:
    cache = f"HiCache {r['write_policy']}" if r.get("write_policy") else "HiCache off"
    head = (
        f"{r.get('id')}  {_health(r)}  {r.get('model') or '?'}  {cache}  {_scraped(r.get('reported') or {})}"
    )
    if r.get("last_error"):
        head += f"  ({r['last_error']})"
    fills = [_fill(t, r) for t in ("gpu", "host", "storage")]
    return [head, _knowledge(knowledge), _load(r), *fills, _hit(r), _ttft(r)]


def warnings(doc: dict[str, Any]) -> list[str]:
    out: list[str] = list(doc.get("warnings") or [])
    for r in doc.get("replicas") or []:
        out += [f"{r.get('id')}: {w}" for w in r.get("warnings") or []]
        if (r.get("reported") or {}).get("enabled") is False:
            out.append(f"{r.get('id')}: serves no /metrics (start SGLang with --enable-metrics)")
        if not r.get("healthy"):
            out.append(f"{r.get('id')}: out of the pool")
    return out


def _decision(d: dict[str, Any]) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(d["at"])) if _num(d.get("at")) else "?"
    cached = f"cached {tokens(d.get('predicted_cached_tokens'))} predicted / {tokens(d.get('cached_tokens'))}"
    return (
        f"  {at}  {d.get('route', '?'):<11} {d.get('replica', '?')}  {d.get('reason', '?'):<15} "
        f"predicted {secs(d.get('predicted_ttft_s'))} · ttft {secs(d.get('ttft_s'))} · {cached} "
        f"reported of {tokens(d.get('prompt_tokens'))}{'' if d.get('ok') else ' · FAILED'}"
    )


def render(doc: dict[str, Any], url: str) -> str:
    replicas = doc.get("replicas") or []
    models = ", ".join(doc.get("models") or []) or "none yet"
    clock = time.strftime("%H:%M:%S", time.localtime(doc["time"])) if _num(doc.get("time")) else ""
    lines = [
        f"kvroute status  {url}  policy {doc.get('policy')}  "
        f"{doc.get('healthy_replicas', 0)}/{len(replicas)} replicas healthy  models {models}  {clock}",
    ]
    knowledge = doc.get("knowledge") or {}
    for r in replicas:
        lines += ["", *replica_block(r, knowledge.get(r.get("id")))]
    decisions = doc.get("decisions") or []
    lines += ["", "recent decisions (newest first)"]
    lines += [_decision(d) for d in decisions[:DECISIONS]] or ["  none yet"]
    lines += ["", "warnings"] + [f"  {w}" for w in warnings(doc) or ["none"]]
    if isinstance(doc.get("warmup"), dict):
        lines += ["", *warmup_table(doc["warmup"])]
    return "\n".join(lines)


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows of cells, each column as wide as its widest cell, two spaces between columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _warm_row(d: dict[str, Any]) -> list[str]:
    cells = (d.get("document"), d.get("tenant") or "-", tokens(d.get("tokens")), d.get("status"))
    return [*map(str, cells), str(d.get("replicas") or "-")]


def warmup_table(w: dict[str, Any]) -> list[str]:
    """The warm-up section: a summary line, then one row per document (at most ``WARM_ROWS``)."""
    docs = [d for d in w.get("documents") or [] if isinstance(d, dict)]
    states: dict[str, int] = {}
    for d in docs:
        states[str(d.get("status"))] = states.get(str(d.get("status")), 0) + 1
    split = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    total = sum(d["tokens"] for d in docs if _num(d.get("tokens")))
    head = (
        f"warm-up  {w.get('jobs', 0)} jobs · {len(docs)} documents{f' ({split})' if split else ''} · "
        f"{tokens(total)} tokens · {w.get('steps', 0)} steps, {w.get('preempted_steps', 0)} preempted"
    )
    if not docs:
        return [head]
    rows = [["document", "tenant", "tokens", "status", "replicas"]]
    rows += [_warm_row(d) for d in docs[:WARM_ROWS]]
    more = [f"  … and {len(docs) - WARM_ROWS} more documents"] if len(docs) > WARM_ROWS else []
    return [head, *_columns(rows), *more]
