"""``python -m bench.labs.fuzz --bodies 10000``: generated bodies through a real gateway, counted by outcome.

Starts 2 emulated replicas (one ``python -m emulator`` process, ``--emu-time-scale 0.001``) and one
``kvroute serve`` process over them (round robin, the in-memory response cache on so that its key and
bypass rules see the bodies too), sends ``--bodies`` bodies from ``bench.labs.fuzz_bodies`` at
``--concurrency`` and counts every answer by status and by who made it: a replica's answer relayed
(``x-kvroute-replica``) or kvroute's own. Targets: 0 kvroute-made 5xx, 0 kvroute-made rejections that
are not OpenAI-shaped, 0 crashes (the gateway process still running and answering), and the gateway's
RSS (``/proc/PID/status`` VmRSS) bounded: read after a warm-up of 500 bodies and at the end. Writes
``bench/results/fuzz.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.labs.fuzz_bodies import MODEL, body, is_openai_error
from bench.labs.proc_stats import rss_kib
from bench.runs.progress import Progress, interrupt, stage
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ManagedProcess, free_ports

RESULTS = Path(__file__).parents[1] / "results" / "fuzz.md"
EMU_ARGS = ("--served-model-name", MODEL, "--emu-time-scale", "0.001")
WARMUP = 500


@dataclass
class Tally:
    by_status: Counter[str] = field(default_factory=Counter)
    kvroute_5xx: list[str] = field(default_factory=list)
    unshaped: list[str] = field(default_factory=list)
    transport_errors: int = 0

    def add(self, status: int, made_by_kvroute: bool, raw: bytes, sample: bytes) -> None:
        self.by_status[f"{status} {'kvroute' if made_by_kvroute else 'replica'}"] += 1
        if made_by_kvroute and status >= 500:
            self.kvroute_5xx.append(sample[:200].decode(errors="replace"))
        if made_by_kvroute and status >= 400 and not is_openai_error(raw):
            self.unshaped.append(sample[:200].decode(errors="replace"))


async def _one(http: aiohttp.ClientSession, url: str, path: str, raw: bytes, tally: Tally) -> bool:
    headers = {"Content-Type": "application/json"}
    try:
        async with http.post(url + path, data=raw, headers=headers) as resp:
            answer = await resp.read()
            tally.add(resp.status, "x-kvroute-replica" not in resp.headers, answer, raw)
            return resp.status < 400
    except (aiohttp.ClientError, TimeoutError):
        tally.transport_errors += 1
        return False


async def run(url: str, gw: ManagedProcess, bodies: int, concurrency: int, seed: int) -> dict[str, object]:
    rng, tally, sem = random.Random(seed), Tally(), asyncio.Semaphore(concurrency)
    progress, rss = Progress("fuzz", bodies), {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(path: str, raw: bytes) -> None:
            async with sem:
                ok = await _one(http, url, path, raw, tally)
            progress.advance(error=not ok)

        pending: set[asyncio.Task[None]] = set()
        for i in range(bodies):
            if i == WARMUP:
                await asyncio.gather(*pending)
                rss["warm"] = rss_kib(gw.pid or 0)
            while len(pending) >= concurrency * 2:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.ensure_future(one(*body(rng))))
        await asyncio.gather(*pending)
        progress.close()
        alive = gw.pid is not None and gw._proc is not None and gw._proc.poll() is None
        async with http.get(url + "/health") as resp:
            healthy = resp.status == 200
    rss["end"] = rss_kib(gw.pid or 0)
    return {"tally": tally, "rss": rss, "alive": alive and healthy}


def report(bodies: int, seed: int, seconds: float, result: dict[str, object]) -> str:
    tally, rss = result["tally"], result["rss"]
    assert isinstance(tally, Tally) and isinstance(rss, dict)
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(tally.by_status.items()))
    growth = (rss["end"] - rss["warm"]) / rss["warm"] * 100 if rss.get("warm") else 0.0
    lines = [
        "# Fuzzing the gateway (`python -m bench.labs.fuzz`)",
        "",
        f"`python -m bench.labs.fuzz --bodies {bodies} --seed {seed}`: {bodies} generated chat and "
        "completions bodies (`bench/labs/fuzz_bodies.py`) through one `kvroute serve` over 2 emulated "
        f"replicas in {seconds:.0f} s.",
        "",
        "| status, made by | answers |",
        "|---|---|",
        rows,
        "",
        f"- kvroute-made 5xx: **{len(tally.kvroute_5xx)}** (target 0)",
        f"- kvroute-made rejections not OpenAI-shaped: **{len(tally.unshaped)}** (target 0)",
        f"- transport errors (no HTTP answer): **{tally.transport_errors}**",
        f"- crashes: **{0 if result['alive'] else 1}** (the gateway still running and healthy at the end)",
        f"- gateway RSS: {rss.get('warm', 0) / 1024:.1f} MiB after {WARMUP} bodies, "
        f"{rss.get('end', 0) / 1024:.1f} MiB at the end ({growth:+.1f}%)",
    ]
    for name, samples in (("kvroute 5xx", tally.kvroute_5xx), ("unshaped", tally.unshaped)):
        lines += [f"- first {name} body: `{samples[0]}`"] if samples else []
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> int:
    stage("starting 2 emulated replicas and kvroute")
    async with EmulatorFleet(2, EMU_ARGS) as emu:
        port = free_ports(1)[0]
        argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--policy", "round_robin",
                "--response-cache", "memory",
                *(a for u in emu.urls for a in ("--backend", u))]  # fmt: skip
        async with ManagedProcess(argv, [f"http://127.0.0.1:{port}"]) as gw:
            t0 = time.monotonic()
            result = await run(f"http://127.0.0.1:{port}", gw, args.bodies, args.concurrency, args.seed)
            text = report(args.bodies, args.seed, time.monotonic() - t0, result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    tally = result["tally"]
    assert isinstance(tally, Tally)
    return 0 if not tally.kvroute_5xx and not tally.unshaped and result["alive"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.labs.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--bodies", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
