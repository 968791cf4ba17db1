"""Exact mode against learned mode (issue 17): `python -m bench.exact [--quick] [workload ...]`.

Every replica of the emulated fleet tokenizes with a real byte-level BPE tokenizer (`emulator/model_bpe`,
`--emu-tokenizer hf`) and publishes its KV events (the 0.5.23 maps, with media: GPU and CPU_PINNED,
HiCache write_back). Three kvroute gateways with the default policy take turns, each on a fresh fleet:

- `kvroute-cost`: today's learned cache model on character-block keys (no tokenizer);
- `kvroute-tokens`: the learned model on token-id keys (`--tokenizer-path`, `--kv-events off`);
- `kvroute-exact`: token-id keys and the replicas' KV events as the truth (`--tokenizer-path`).

Per workload (load 0.6, or its own pace for agent and probe; seed 1, or the mean of `--seeds`) it
reports each gateway's mean TTFT and its cache-model error, sum |predicted - reported cached| / sum
prompt tokens (bench.point), and judges issue 17's targets: exact's error <= 0.5% on every workload,
exact's mean TTFT <= learned's (the better of the two learned gateways; within 3%, the noise of one run
on this machine, counts as equal).
Beside exact's error it gives the share of prompt tokens of its run that a replica held when the request
arrived and evicted while the request waited in its queue (`bench.reports.fleet_work.cache_loss`, from the
emulators' counters): what a model would still over-predict if it knew every cache exactly at the moment it
routed, which is the most the KV events can tell it.
With several seeds the ratio column also gives each seed's ratio: one seed's trajectory decides where
the first documents land and so the whole run (rag, seeds 1-6: token keys / character keys 1.10, 1.09,
1.04, 0.97, 0.90, 0.97), so one seed cannot tell a 3% difference.
Results go to OUT/<point>/<workload>/ as for `kvroute bench`, the verdicts to OUT/exact.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.point import run_point
from bench.reports import tables as report
from bench.runs import plan
from bench.runs.plan import Point
from bench.runs.prepare import RunSettings
from bench.systems import registry as systems
from bench.systems.fleet import FleetSpec
from bench.workloads import generators as workloads

TOKENIZER = str(Path(__file__).resolve().parent.parent / "emulator" / "model_bpe")
EVENTS = "0.5.23"
MAX_ERROR = 0.005
TTFT_TOLERANCE = 1.03
LEARNED = ("kvroute-cost", "kvroute-tokens")
EXACT = "kvroute-exact"


def exact_systems() -> tuple[systems.System, ...]:
    """The three gateways of the module docstring."""
    cost = systems.kvroute("cost")
    tokens = systems.kvroute("cost", "--tokenizer-path", TOKENIZER, "--kv-events", "off")
    exact = systems.kvroute("cost", "--tokenizer-path", TOKENIZER)
    return cost, replace(tokens, name="kvroute-tokens"), replace(exact, name=EXACT)


def points(names: list[str], seeds: Sequence[int] = (1,)) -> tuple[Point, ...]:
    chosen = names or list(workloads.GENERATORS)
    return plan.custom(chosen, [plan.DEFAULT_LOAD], [plan.DEFAULT_PROFILE], list(seeds))


def verdict_rows(out: Path, pts: tuple[Point, ...]) -> list[str]:
    """One markdown row per workload: TTFT and error of each gateway, exact / learned, the verdicts."""
    rows = []
    for point in pts:
        for name in point.workloads:
            path = out / point.directory / name / "summary.json"
            if path.exists():
                rows.append(_row(name, _by_system(path), _seed_ratios(path.parent, point.seeds)))
    return rows


def _by_system(path: Path) -> dict[str, report.Summary]:
    return {s.system: s for s in report.load_summaries(path)[1]}


def _seed_ratios(directory: Path, seeds: Sequence[int]) -> str:
    """Exact / best learned mean TTFT per seed ("" with one seed: the ratio column says it)."""
    if len(seeds) < 2:
        return ""
    ratios = []
    for seed in seeds:
        path = directory / f"seed-{seed}" / "summary.json"
        ratio = _ratio(_by_system(path)) if path.exists() else None
        ratios.append(f"{ratio:.2f}" if ratio is not None else "n/a")
    return ", ".join(ratios)


def _ratio(by: dict[str, report.Summary]) -> float | None:
    """Exact's mean TTFT over the better learned gateway's (None when either is missing)."""
    exact, learned = by.get(EXACT), [by[s].mean_ttft for s in LEARNED if s in by]
    return exact.mean_ttft / min(learned) if exact is not None and learned else None


def _row(name: str, by: dict[str, report.Summary], per_seed: str = "") -> str:
    cells = [name]
    for system in (*LEARNED, EXACT):
        s = by.get(system)
        cells.append(f"{s.mean_ttft:.2f} s, {100 * s.model_error:.2f}%" if s else "n/a")
    exact, ratio = by.get(EXACT), _ratio(by)
    lost = exact.engine_loss if exact is not None else float("nan")
    cells.append(f"{100 * lost:.2f}%" if lost == lost else "n/a")
    if exact is None or ratio is None:
        return "| " + " | ".join([*cells, "n/a", "n/a", "n/a"]) + " |"
    error_ok = exact.model_error <= MAX_ERROR
    shown = f"{ratio:.2f}x" + (f" ({per_seed})" if per_seed else "")
    cells += [shown, "PASS" if error_ok else "MISS", "PASS" if ratio <= TTFT_TOLERANCE else "MISS"]
    return "| " + " | ".join(cells) + " |"


def write_verdicts(out: Path, pts: tuple[Point, ...], command: str) -> str:
    head = (
        "| workload | learned, char keys (TTFT, error) | learned, token keys | exact (KV events) "
        "| evicted under waiting requests (exact run) "
        "| exact / best learned TTFT | error <= 0.5% | TTFT <= learned |\n|---|---|---|---|---|---|---|---|"
    )
    md = "\n".join([f"`{command}`", "", head, *verdict_rows(out, pts)]) + "\n"
    (out / "exact.md").write_text(md)
    return md


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.exact", description=__doc__.split("\n")[0])
    p.add_argument("workloads", nargs="*", default=[], help=f"any of {', '.join(workloads.GENERATORS)}")
    p.add_argument("--quick", action="store_true", help="the benchmark's small workloads")
    p.add_argument("--out", type=Path, default=None, help="default bench/results/exact")
    p.add_argument("--seeds", type=plan.seeds_arg, default=(1,), help="e.g. 1,2,3 (default 1): their mean")
    p.add_argument("--max-run-seconds", type=float, default=240.0)
    p.add_argument(
        "--time-scale", type=float, default=None, help="wall s per modelled s (default: the workload's)"
    )
    a = p.parse_args(argv)
    unknown = [w for w in a.workloads if w not in workloads.GENERATORS]
    if unknown:
        p.error(f"unknown workloads {unknown}")
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    out = a.out or Path(__file__).resolve().parent / "results" / "exact"
    fleet = FleetSpec.default(4, a.quick, a.time_scale, None)
    fleet = replace(fleet, tokenizer=TOKENIZER, kv_events=EVENTS)
    command = shlex.join(["python", "-m", "bench.exact", *argv])
    run = RunSettings(exact_systems(), fleet, a.quick, out, a.max_run_seconds, command, a.time_scale)
    pts = points(a.workloads, a.seeds)
    total = sum(len(p.workloads) for p in pts)
    for i, (point, name) in enumerate(((p, n) for p in pts for n in p.workloads), 1):
        print(f"== [{i}/{total}] {name}, {point.describe()}", file=sys.stderr)
        asyncio.run(run_point(run, replace(point, workloads=(name,)), name))
    print(write_verdicts(out, pts, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
