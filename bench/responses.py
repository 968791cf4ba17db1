"""Responses API benchmark: chains kept by the gateways, against the same conversations sent over chat.

Method (one run, this machine, everything on loopback):
1. Three emulated SGLang replicas, each its own process (``EmulatorFleet(1)``: one can be killed), with
   SGLang's default of no response store; one ``redis-server``; two ``kvroute serve`` gateways (policy
   cost) sharing it (``--state redis://...``: the chains and the routing state).
2. Workload (seeded): ``--chains`` conversations of ``--turns`` turns; each has its own instructions
   (~``--instruction-tokens`` tokens) and a question per turn (~``--question-tokens``); answers are at
   most 48 tokens (chat ``max_tokens`` 46, the same budget); a share of the chains streams
   (``--streamed``). ``--concurrency`` chains run at once, each turn ``--think-s`` (20 ms) after the
   answer to the one before (a client's own time; at 0, chat follow-ups that reach the other gateway
   within a few ms of the answer sometimes route before it has the first gateway's latest load, and
   move); turn k of chain c goes to gateway (c + k) mod 2, so every follow-up crosses to the other one.
3. A warm-up (``--warmup`` chains of other texts over chat, then over Responses, unmeasured: the gateways
   learn the replicas' rates), then the phases, each after ``POST /flush_cache`` through both gateways
   (empty replicas, routers told):
   ``chat`` (the whole conversation in ``messages`` each turn), ``responses`` (``previous_response_id``,
   the gateways expand the chain), and ``responses, replica killed`` (not streamed: a stream cut by a
   dead replica cannot be resumed): once half of its turns are answered, the process of the replica
   that answered the last of them gets SIGKILL.
4. Per phase: chains completed, failed turns, the share of follow-ups answered by the replica of the turn
   before (``x-kvroute-replica``; follow-ups answered after the kill whose turn before was the dead
   replica's are counted apart), cached tokens over input tokens (the replicas' own usage), turn latency
   p50 and p99.
Targets: 0 failures; >= 95% of follow-ups on the previous turn's replica; the Responses cached-token ratio
within 2 points of chat's; with a replica killed, every chain completes.
Results: ``bench/results/responses/responses.{md,json}``; the table is also printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench.overhead.requests import pct_ms
from bench.runs.chains import Kill, Phase, Turn, make_chains, run_phase
from bench.systems.fleet import EmulatorFleet, FleetSpec
from bench.systems.gateway_pool import ADMIN_KEY, GatewayPool, StateStore
from bench.systems.procs import served_model
from bench.systems.redis_proc import redis_server

OUT_DIR = Path(__file__).resolve().parent / "results" / "responses"


@dataclass(frozen=True, slots=True)
class Summary:
    phase: str
    chains: int
    chains_complete: int
    turns: int
    failed: int
    follow_ups: int
    stayed: int
    moved_off_killed: int
    cached_ratio: float
    p50_ms: float
    p99_ms: float
    wall_s: float

    @property
    def stayed_share(self) -> float:
        return self.stayed / self.follow_ups if self.follow_ups else 0.0


def summarize(phase: Phase, chains: int, turns_per_chain: int) -> Summary:
    by = {(t.chain, t.turn): t for t in phase.turns}
    complete = sum(
        all(by.get((c, k), Turn(c, k, False)).ok for k in range(turns_per_chain)) for c in range(chains)
    )
    killed = phase.kill.victim if phase.kill is not None else None
    follow = stayed = moved = 0
    for t in phase.turns:
        before = by.get((t.chain, t.turn - 1))
        if not t.ok or before is None:
            continue
        if t.after_kill and before.replica == killed:
            moved += 1
            continue
        follow += 1
        stayed += t.replica == before.replica
    ok = [t for t in phase.turns if t.ok]
    inputs = sum(t.input_tokens for t in ok)
    lat = [t.latency_s for t in ok]
    failed = sum(not t.ok for t in phase.turns)
    ratio = sum(t.cached_tokens for t in ok) / inputs if inputs else 0.0
    return Summary(
        phase.name, chains, complete, len(phase.turns), failed, follow, stayed, moved, ratio,
        pct_ms(lat, 0.5), pct_ms(lat, 0.99), time.monotonic() - phase.started,
    )  # fmt: skip


def table(rows: Sequence[Summary]) -> str:
    lines = [
        "| phase | chains complete | turns | failed | follow-ups on the previous turn's replica "
        "| moved off the killed replica | cached / input tokens | p50 ms | p99 ms | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        lines.append(
            f"| {s.phase} | {s.chains_complete}/{s.chains} | {s.turns} | {s.failed} | "
            f"{s.stayed}/{s.follow_ups} ({s.stayed_share:.1%}) | {s.moved_off_killed} | "
            f"{s.cached_ratio:.1%} | "
            f"{s.p50_ms:.0f} | {s.p99_ms:.0f} | {s.wall_s:.0f} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[Summary]) -> list[tuple[str, bool, str]]:
    chat, resp, killed = rows
    gap = abs(resp.cached_ratio - chat.cached_ratio) * 100
    return [
        (
            "0 failures (Responses phases)",
            resp.failed + killed.failed == 0,
            f"{resp.failed} + {killed.failed}",
        ),
        (
            ">= 95% of follow-ups on the previous turn's replica",
            resp.stayed_share >= 0.95,
            f"{resp.stayed_share:.1%}",
        ),
        (
            "cached-token ratio within 2 points of chat",
            gap <= 2.0,
            f"{resp.cached_ratio:.1%} vs {chat.cached_ratio:.1%} ({gap:.1f} points)",
        ),
        (
            "a replica killed halfway: every chain completes",
            killed.chains_complete == killed.chains,
            f"{killed.chains_complete}/{killed.chains}",
        ),
    ]


async def _flush(gateways: Sequence[str]) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with aiohttp.ClientSession() as http:
        for url in gateways:
            async with http.post(url + "/flush_cache", headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"{url}/flush_cache answered {r.status}: {await r.text()}")


async def bench(args: argparse.Namespace) -> list[Summary]:
    logs = args.out / "logs"
    chains = make_chains(
        args.chains, args.turns, args.seed, args.instruction_tokens, args.question_tokens, args.streamed
    )
    spec = FleetSpec(1, args.gpu_tokens, args.time_scale)
    async with contextlib.AsyncExitStack() as up:
        redis_url = up.enter_context(redis_server())
        fleets = [
            await up.enter_async_context(EmulatorFleet(1, spec.args(i), logs / f"replica-{i}.log"))
            for i in range(3)
        ]
        urls = [f.urls[0] for f in fleets]
        pool = await up.enter_async_context(
            GatewayPool(2, urls, logs, StateStore(redis_url, "bench-responses"))
        )
        model = await served_model(urls[0]) or "default"
        warm = make_chains(
            args.warmup, args.turns, args.seed + 1, args.instruction_tokens, args.question_tokens, 0.5
        )
        for mode in ("chat", "responses") if warm else ():  # rates learned, connections open: unmeasured
            await run_phase(
                Phase(f"warm-up ({mode})", mode, model, list(pool.urls)), warm, args.concurrency, 60.0
            )
        rows = []
        total = args.chains * args.turns
        plan: list[tuple[str, str, Kill | None]] = [("chat", "chat", None), ("responses", "responses", None)]
        plan.append(("responses, replica killed", "responses", Kill(fleets, total // 2)))
        for name, mode, kill in plan:
            await _flush(pool.urls)
            phase = Phase(name, mode, model, list(pool.urls), kill)
            await run_phase(phase, chains, args.concurrency, args.phase_cap_s, args.think_s)
            rows.append(summarize(phase, args.chains, args.turns))
        return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.responses", description=__doc__.split("\n")[0])
    p.add_argument("--chains", type=int, default=100, help="conversations per phase (default 100)")
    p.add_argument("--turns", type=int, default=5, help="turns per conversation (default 5)")
    p.add_argument("--concurrency", type=int, default=10, help="conversations at once (default 10)")
    p.add_argument("--instruction-tokens", type=int, default=600, help="instructions per chain (default 600)")
    p.add_argument("--question-tokens", type=int, default=60, help="each turn's question (default 60)")
    p.add_argument("--streamed", type=float, default=0.5, help="share of chains streamed (default 0.5)")
    p.add_argument("--gpu-tokens", type=int, default=48_000, help="each replica's GPU pool (default 48000)")
    p.add_argument("--time-scale", type=float, default=0.05, help="emulated time x this (default 0.05)")
    p.add_argument(
        "--think-s",
        type=float,
        default=0.02,
        help="seconds between an answer and the chain's next turn: the client's own time (default 0.02)",
    )
    p.add_argument(
        "--phase-cap-s", type=float, default=600.0, help="no chain starts after this (default 600)"
    )
    p.add_argument("--warmup", type=int, default=20, help="unmeasured chains per API first (default 20)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=OUT_DIR)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = asyncio.run(bench(args))
    md = table(rows)
    checks = "\n".join(f"- {'PASS' if ok else 'FAIL'}: {what}: {value}" for what, ok, value in verdicts(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "wall_s": round(time.monotonic() - t0, 1),
        "command": " ".join(["python -m bench.responses", *(argv if argv is not None else sys.argv[1:])]),
    }
    doc = {"meta": meta, "phases": [asdict(r) | {"stayed_share": r.stayed_share} for r in rows]}
    (args.out / "responses.json").write_text(json.dumps(doc, indent=2))
    head = f"# Responses API: chains kept by the gateways\n\n`{meta['command']}` "
    head += f"({meta['cores']} cores, {meta['wall_s']} s)\n\n"
    (args.out / "responses.md").write_text(head + md + "\n\n" + checks + "\n")
    print(md + "\n\n" + checks)
    return 0 if all(ok for _, ok, _ in verdicts(rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
