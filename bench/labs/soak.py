"""``python -m bench.labs.soak --minutes 10`` (``make soak``): a bounded soak of one gateway under faults.

Starts a ``redis-server`` of its own (``bench.systems.redis_proc``), 4 emulated replicas in one process
(``bench.systems.fleet.EmulatorFleet``, faults on, ``--emu-time-scale 0.05``) and one ``kvroute serve --policy
cost --state redis://...`` over them, then for ``--minutes`` runs ``--workers`` clients in a loop, each
request one of: an agent turn (a conversation that grows, sticky by ``x-session-id``), a RAG question
(one of a few long shared documents + a question), a stream read to its end, and a stream the client
leaves after its first chunk (a disconnect). Every ``--fault-every`` seconds one replica gets one fault
from ``/_emu/faults`` in turn: fail (503 x3), cut_stream, reset, slow (x4 for a while), restart.

Outcomes per request: ok; failed with a status (kvroute's own or a replica's); a stream cut after its
first byte that ended with kvroute's SSE error event (the promised behaviour, counted apart); a client
disconnect (intended); lost: no HTTP answer at all, or a body that never ended within the client's
timeout (target 0). Every ``--sample-every`` seconds the gateway's RSS and open fds are read from /proc;
the first samples after ``--warmup`` seconds are the baseline, the mean of the last ones the end
(target: within 10%). Writes ``bench/results/soak.md`` and ``soak.png``; exits 1 when a request was
lost or the gateway died.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from bench.labs.proc_stats import open_fds, rss_kib
from bench.reports.soak import Sample, plot, table
from bench.runs.progress import Progress, interrupt, stage
from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import ManagedProcess, free_ports
from bench.systems.redis_proc import redis_server

MODEL = "emu-model"
RESULTS = Path(__file__).parents[1] / "results"
EMU_ARGS = ("--served-model-name", MODEL, "--emu-time-scale", "0.05", "--emu-enable-faults",
            "--enable-cache-report", "--page-size", "16", "--max-total-tokens", "60000")  # fmt: skip
DOCS = [f"Document {d}. " + " ".join(f"fact {d}.{i} is {i * d % 97}." for i in range(300)) for d in range(6)]
FAULTS = (
    {"action": "fail", "status": 503, "count": 3},
    {"action": "cut_stream", "after_chunks": 1, "count": 2},
    {"action": "reset", "count": 2},
    {"action": "slow", "factor": 4},
    {"action": "restart"},
)
KINDS = ("agent", "rag", "stream", "disconnect")


def _request(kind: str, rng: random.Random, convo: list[dict[str, str]]) -> tuple[dict[str, object], bool]:
    """The body of one request of ``kind`` and whether it streams."""
    if kind == "agent":
        convo.append({"role": "user", "content": f"step {len(convo)}: call the tool {rng.randrange(9)}"})
        messages = [{"role": "system", "content": "You are an agent. " * 40}, *convo[-12:]]
    else:
        doc = rng.choice(DOCS)
        messages = [{"role": "system", "content": doc}, {"role": "user", "content": f"q{rng.randrange(99)}?"}]
    stream = kind in ("stream", "disconnect")
    body: dict[str, object] = {"model": MODEL, "messages": messages, "max_tokens": rng.randint(4, 16)}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body, stream


async def _stream(resp: aiohttp.ClientResponse, leave: bool) -> str:
    """Reads an SSE answer: "ok", "disconnect" (we left), "sse_error" (kvroute's error event), "cut"."""
    saw_done = False
    async for line in resp.content:
        if leave:
            return "disconnect"
        if line.startswith(b'data: {"error"'):
            return "sse_error"
        saw_done = saw_done or line.strip() == b"data: [DONE]"
    return "ok" if saw_done else "cut"


async def one(http: aiohttp.ClientSession, url: str, kind: str, rng: random.Random,
              convo: list[dict[str, str]], session: str) -> str:  # fmt: skip
    body, stream = _request(kind, rng, convo)
    headers = {"Content-Type": "application/json", "x-session-id": session}
    try:
        async with http.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
            if r.status != 200:
                who = "replica" if "x-kvroute-replica" in r.headers else "kvroute"
                return f"{r.status} {who}"
            if stream:
                return await _stream(r, kind == "disconnect")
            await r.read()
            return "ok"
    except (aiohttp.ClientError, TimeoutError) as e:
        return f"lost ({type(e).__name__})"


async def _worker(url: str, until: float, seed: int, outcomes: Counter[str]) -> None:
    rng, convo = random.Random(seed), []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for turn in itertools.count():
            if time.monotonic() >= until:
                return
            kind = rng.choices(KINDS, weights=(4, 3, 2, 1))[0]
            if kind == "agent" and len(convo) > 30:
                convo = []
            outcome = await one(http, url, kind, rng, convo, f"s{seed}-{turn // 40}")
            outcomes[outcome] += 1
            outcomes["requests"] += 1
            outcomes["lost"] += outcome.startswith("lost")
            await asyncio.sleep(rng.uniform(0.0, 0.05))  # a client's think time


async def _faults(urls: list[str], until: float, every_s: float, log: list[str]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for i in itertools.count():
            await asyncio.sleep(every_s)
            if time.monotonic() >= until - every_s:
                return
            url, fault = urls[i % len(urls)], FAULTS[i % len(FAULTS)]
            async with http.post(url + "/_emu/faults", json=fault) as resp:
                log.append(f"{fault['action']}@{url.rsplit(':', 1)[1]}:{resp.status}")
            if fault["action"] == "slow":
                await asyncio.sleep(every_s / 2)
                async with http.post(url + "/_emu/faults", json={"action": "clear"}):
                    pass


async def _sampler(pid: int, until: float, every_s: float, samples: list[Sample], progress: Progress,
                   outcomes: Counter[str]) -> None:  # fmt: skip
    t0 = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(every_s)
        samples.append(Sample(time.monotonic() - t0, rss_kib(pid), open_fds(pid), outcomes["requests"]))
        progress.advance()


async def soak(args: argparse.Namespace) -> int:
    seconds = args.minutes * 60
    with redis_server() as redis_url:
        stage(f"redis {redis_url}; starting 4 emulated replicas and kvroute --state")
        async with EmulatorFleet(4, EMU_ARGS) as emu:
            port = free_ports(1)[0]
            argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--policy", "cost",
                    "--state", redis_url, "--health-interval", "1",
                    *(a for u in emu.urls for a in ("--backend", u))]  # fmt: skip
            async with ManagedProcess(argv, [f"http://127.0.0.1:{port}"]) as gw:
                url, until = f"http://127.0.0.1:{port}", time.monotonic() + seconds
                outcomes: Counter[str] = Counter()
                samples: list[Sample] = []
                faults: list[str] = []
                progress = Progress(f"soak {args.minutes:g} min", int(seconds / args.sample_every))
                stage(f"soak {seconds:.0f} s, {args.workers} clients, a fault every {args.fault_every:g} s")
                await asyncio.gather(
                    *(_worker(url, until, s, outcomes) for s in range(args.workers)),
                    _faults(emu.urls, until, args.fault_every, faults),
                    _sampler(gw.pid or 0, until, args.sample_every, samples, progress, outcomes),
                )
                progress.close(f"{outcomes['requests']} requests")
                alive = gw._proc is not None and gw._proc.poll() is None
    text = table(args, outcomes, samples, faults, alive)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.md").write_text(text)
    plot(args.out / "soak.png", samples, args.warmup)
    return 0 if outcomes["lost"] == 0 and alive else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.labs.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--fault-every", type=float, default=15.0, help="seconds between injected faults")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/fd samples")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the baseline sample")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.warmup = min(args.warmup, args.minutes * 60 / 4)
    signal.signal(signal.SIGTERM, interrupt)
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
