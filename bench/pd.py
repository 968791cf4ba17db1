"""Prefill/decode fleets (issue 41): kvroute's pairs, sglang-router's PD mode, the same GPUs unified.

    python -m bench.pd              # the full run (make bench runs it)
    python -m bench.pd --quick      # small workloads, results under /tmp/kvroute-pd-quick

For each workload (rag and mixed at offered loads 0.3, 0.6 and 0.9; agent at its own pace, being closed
loop), seed 1 and the bench's default profile, every system on a fresh fleet of its own, with the same
requests at the same arrival times:

- kvroute-pd, sglang-pd-cache_aware and sglang-pd-round_robin on a PD fleet of 2 prefill + 2 decode
  servers (bench/systems/pd.py);
- kvroute-unified (``kvroute serve --policy cost``) on 4 unified replicas: the same four GPUs, each of
  them prefilling and decoding.

Workloads are built for 2 replicas (the PD fleet's prefill servers hold its prefix cache) and rescaled to
the offered load of those 2 prefill servers (bench/runs/prepare.py, bench/workloads/load.py); the unified
fleet gets the same arrivals on twice the prefill engines, each of which also decodes. Then:

- repeats: distinct ~2K-token prompts sent twice each, one at a time, through kvroute-pd and
  sglang-pd-cache_aware (fresh fleets): how much of each second send its prefill had cached;
- the kill: kvroute-pd on rag at load 0.6 once more, decode server #1's process SIGKILLed at 40% of the
  arrival span: requests lost before they began streaming, and cut while streaming.

Results: OUT/pd.md, pd.json and pd.png (bench/reports/pd.py), and each point's table, summary and records
under OUT/<profile>/<load-dir>/<workload>/ as ``kvroute bench`` writes them (bench.reports.tables).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from bench.point import caption
from bench.reports import tables
from bench.reports.pd import SUBJECT, UNIFIED, Kill, PdPoint, Repeat, write
from bench.runs.cpu import CpuMeter
from bench.runs.plan import DEFAULT_PROFILE, Point
from bench.runs.prepare import Prepared, RunSettings, prepare
from bench.runs.progress import Progress, interrupt, stage
from bench.runs.replay import During, Record, replay, rotating
from bench.systems.fleet import EmulatorFleet, FleetSpec, replica_counters
from bench.systems.pd import PdFleet, pd_systems
from bench.systems.procs import NotReady, served_model
from bench.systems.registry import System, kvroute, system_process
from bench.workloads.load import arrival_span
from bench.workloads.text import WordSource

OUT_DIR = Path(__file__).resolve().parent / "results" / "pd"
QUICK_OUT = Path("/tmp/kvroute-pd-quick")
PREFILLS, DECODES, UNIFIED_REPLICAS = 2, 2, 4
LOADS = (0.3, 0.6, 0.9)
OPEN_LOOP, CLOSED_LOOP = ("rag", "mixed"), ("agent",)
KILL_AT, KILL_LOAD = 0.4, 0.6
REPEAT_TOKENS = 2000


@dataclass(frozen=True, slots=True)
class Config:
    run: RunSettings
    loads: tuple[float, ...]
    workloads: tuple[str, ...]
    repeats: int
    kill: bool


def unified_system() -> System:
    return replace(kvroute("cost"), name=UNIFIED, note=f"{UNIFIED_REPLICAS} unified replicas")


async def _replay(prep: Prepared, url: str, label: str, during: During | None = None) -> list[Record]:
    progress = Progress(label, len(prep.workload.requests))
    model = await served_model(url)
    records = await replay(
        prep.workload, rotating([url]), prep.fleet.time_scale, prep.deadline_s, progress, model, during=during
    )
    progress.close()
    return records


async def run_system(
    prep: Prepared, system: System, seed: int, logs: Path, during_kill: float | None = None
) -> tables.Summary:
    """One system on a fresh fleet of its own; raises NotReady when it does not come up."""
    meter, label = CpuMeter(), f"{prep.workload.name:<6} {system.name}"
    if system.name == UNIFIED:
        spec = replace(prep.fleet, replicas=UNIFIED_REPLICAS)
        async with EmulatorFleet(UNIFIED_REPLICAS, spec.args(seed), logs / "unified.emulator.log") as fleet:
            async with system_process(system, fleet.urls, logs / f"{system.name}.log") as proc:
                records = await _replay(prep, proc.urls[0], label)
            served = await replica_counters(fleet.urls)
    else:
        async with PdFleet(prep.fleet, PREFILLS, DECODES, seed, logs) as fleet:
            async with fleet.system_process(system, logs / f"{system.name}.log") as proc:
                during = _killer(fleet, prep, during_kill) if during_kill is not None else None
                records = await _replay(prep, proc.urls[0], label, during)
            served = await replica_counters(fleet.prefills)
    per_replica = {r: c.requests for r, c in served.items()}
    return tables.summarize(
        system.name, records, per_replica, {}, system.note, foreign_cpu=meter.stop().foreign_cores
    )


def _kill_time(prep: Prepared, frac: float) -> float:
    first = min((r.arrival_s for r in prep.workload.requests if r.after is None), default=0.0)
    return first + frac * arrival_span(prep.workload)


def _killer(fleet: PdFleet, prep: Prepared, at_s: float) -> During:
    async def kill(session: aiohttp.ClientSession, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + at_s * prep.fleet.time_scale - time.perf_counter()))
        fleet.kill_decode(1)

    return kill


async def run_point(cfg: Config, workload: str, load: float | None, systems: Sequence[System]) -> PdPoint:
    point = Point(DEFAULT_PROFILE, load, (1,), (workload,))
    prep = prepare(cfg.run, point, workload, 1)
    target = cfg.run.out_dir / point.directory / workload
    summaries: dict[str, tables.Summary] = {}
    skipped: dict[str, str] = {}
    for system in systems:
        try:
            summaries[system.name] = await run_system(prep, system, 1, target / "logs")
        except NotReady as exc:
            skipped[system.name] = str(exc)[:300]
    meta = {
        **prep.fleet.meta(), "load": load, "requests": len(prep.workload.requests),
        "command": cfg.run.command, "pd_fleet": f"{PREFILLS} prefill + {DECODES} decode",
        "unified_fleet": UNIFIED_REPLICAS,
    }  # fmt: skip
    title = caption(workload, point, [1], prep.offered)
    md = tables.write_results(target, workload, meta, list(summaries.values()), {}, skipped, title)
    print(md, file=sys.stderr)
    return PdPoint(workload, load, summaries, skipped)


async def run_kill(cfg: Config) -> Kill:
    point = Point(DEFAULT_PROFILE, KILL_LOAD, (1,), ("rag",))
    prep = prepare(cfg.run, point, "rag", 1)
    at_s = _kill_time(prep, KILL_AT)
    (system,) = [s for s in pd_systems() if s.name == SUBJECT]
    logs = cfg.run.out_dir / "kill" / "logs"
    async with PdFleet(prep.fleet, PREFILLS, DECODES, 1, logs) as fleet:  # noqa: SIM117 (fleet is used)
        async with fleet.system_process(system, logs / f"{system.name}.log") as proc:
            records = await _replay(
                prep, proc.urls[0], "rag    kvroute-pd, a decode killed", _killer(fleet, prep, at_s)
            )
            retried = await _retried(proc.urls[0])
    failed = [r for r in records if not r.ok]
    unsent = [r for r in failed if r.error in ("deadline", "timeout") and r.ttft_s is None]
    lost = [r for r in failed if r.ttft_s is None and r not in unsent]
    cut = [r for r in failed if r.ttft_s is not None]
    return Kill(
        "rag",
        KILL_LOAD,
        round(at_s, 2),
        len(records),
        len(records) - len(failed),
        len(lost),
        len(cut),
        len(unsent),
        retried,
    )


async def _retried(url: str) -> int:
    """Pair attempts kvroute retried because their decode server failed first (its /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('kvroute_pd_pair_failures_total{side="decode"}'):
            return int(float(line.split()[-1]))
    return 0


async def _twice(http: aiohttp.ClientSession, url: str, model: str | None, text: str) -> tuple[int, int]:
    body = {"model": model or "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    usage: dict[str, object] = {}
    for _ in range(2):
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            doc = await resp.json(content_type=None)
            usage = doc.get("usage") or {} if resp.status == 200 else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    prompt = usage.get("prompt_tokens")
    return int(prompt) if isinstance(prompt, int) else 0, int(cached) if isinstance(cached, int) else 0


async def run_repeats(cfg: Config, system: System) -> Repeat:
    spec = FleetSpec.default(PREFILLS, cfg.run.quick, None, None)
    logs = cfg.run.out_dir / "repeats" / "logs"
    words = WordSource(41)
    texts = [words.document(f"Document {i}", REPEAT_TOKENS) for i in range(cfg.repeats)]
    async with PdFleet(spec, PREFILLS, DECODES, 1, logs) as fleet:  # noqa: SIM117 (fleet is used)
        async with fleet.system_process(system, logs / f"{system.name}.log") as proc:
            url = proc.urls[0]
            model = await served_model(url)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                sends = [await _twice(http, url, model, t) for t in texts]
    fractions = [c / p if p else 0.0 for p, c in sends]
    total = sum(p for p, _ in sends)
    cached = sum(c for _, c in sends) / total if total else 0.0
    return Repeat(system.name, len(sends), total // max(len(sends), 1), cached, min(fractions, default=0.0))


def parse(argv: Sequence[str]) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m bench.pd", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    p.add_argument("--quick", action="store_true", help=f"small workloads; results under {QUICK_OUT}")
    p.add_argument("--loads", default=",".join(map(str, LOADS)), help="offered loads of rag and mixed")
    p.add_argument("--workloads", default="rag,agent,mixed", help="of rag, agent, mixed")
    p.add_argument("--repeats", type=int, default=10, help="distinct ~2K-token prompts sent twice")
    p.add_argument("--no-kill", action="store_true", help="skip the decode-kill run")
    p.add_argument("--max-run-seconds", type=float, default=240.0, help="wall-clock cap per run")
    p.add_argument(
        "--time-scale", type=float, default=None, help="wall s per modelled s (default: each workload's)"
    )
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    names = tuple(w for w in a.workloads.split(",") if w)
    unknown = [w for w in names if w not in (*OPEN_LOOP, *CLOSED_LOOP)]
    if unknown:
        p.error(f"unknown workloads {unknown}: choose among {', '.join((*OPEN_LOOP, *CLOSED_LOOP))}")
    loads = tuple(float(x) for x in a.loads.split(",") if x)
    fleet = FleetSpec.default(PREFILLS, a.quick, None, None)
    out = a.out or (QUICK_OUT if a.quick else OUT_DIR)
    command = shlex.join(["python", "-m", "bench.pd", *argv])
    if a.time_scale is not None and not a.time_scale > 0:
        p.error("--time-scale must be positive")
    run = RunSettings((), fleet, a.quick, out, a.max_run_seconds, command, a.time_scale)
    return Config(run, loads, names, a.repeats, not a.no_kill)


def main(argv: Sequence[str]) -> int:
    signal.signal(signal.SIGTERM, interrupt)
    cfg = parse(argv)
    t0 = time.monotonic()
    systems = (*pd_systems(), unified_system())
    points: list[PdPoint] = []
    todo: list[tuple[str, float | None]] = [
        (w, x) for w in cfg.workloads if w in OPEN_LOOP for x in cfg.loads
    ]
    todo += [(w, None) for w in cfg.workloads if w in CLOSED_LOOP]
    for i, (w, load) in enumerate(todo):
        stage(f"[{i + 1}/{len(todo)}] {w} at {'own pace' if load is None else f'load {load:g}'} "
              f"({(time.monotonic() - t0) / 60:.1f} min so far)")  # fmt: skip
        points.append(asyncio.run(run_point(cfg, w, load, systems)))
    repeats = [asyncio.run(run_repeats(cfg, s)) for s in pd_systems()[:2]] if cfg.repeats > 0 else []
    kill = asyncio.run(run_kill(cfg)) if cfg.kill else None
    minutes = (time.monotonic() - t0) / 60
    meta: dict[str, object] = {
        "command": cfg.run.command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "size": f"{'quick' if cfg.run.quick else 'full'} size, {minutes:.1f} min",
        "profile": DEFAULT_PROFILE,
    }
    print(write(cfg.run.out_dir, points, repeats, kill, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
