"""``kvroute demo``: the gateway in front of 3 emulated SGLang replicas, a short scripted workload
through the official ``openai`` SDK, and a printed summary.

What it runs (seeded, a few seconds of wall time), once per policy of ``--policies`` (default
``cost,round_robin``), each on fresh replicas so no cache leaks from one policy to the next:
- 3 emulated replicas (HiCache ``write_back``, cache report, metrics; a time scale that makes a
  cold 40K-token prefill take ~1.5 s instead of 15 s);
- the gateway as users run it, ``kvroute serve --backend URL ... --policy P`` (a subprocess on a free
  loopback port, ``bench.systems.procs``; its log goes to ``--logs``), spoken to over HTTP only;
- 4 agent sessions that share a system prompt and tool schemas, 4 streamed turns each (each turn
  extends its own history), running concurrently;
- 2 long documents, each asked 3 different questions (streamed);
Each request records its TTFT (first content chunk), prompt and cached tokens (``include_usage``) and
the replica that served it (``x-kvroute-replica``). The table prints, per policy side by side,
requests, errors, mean/p50/p99 TTFT in emulated seconds, the token-weighted cached ratio and the
requests per replica. Everything started is stopped; the exit status is 0 only if nothing failed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from bench.systems.fleet import EmulatorFleet
from bench.systems.procs import NotReady, replica_id
from bench.systems.registry import kvroute, system_process

EMU_ARGS = [
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "write_back",
    "--enable-cache-report",
    "--enable-metrics",
    "--tool-call-parser",
    "qwen25",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool for the agent " * 6,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("search", "read_file", "write_file", "run_tests")
]


@dataclass(frozen=True, slots=True)
class Sample:
    kind: str
    ok: bool
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    replica: str


def words(rng: random.Random, n: int) -> str:
    vocab = [
        "agent",
        "cache",
        "token",
        "replica",
        "prefix",
        "router",
        "memory",
        "host",
        "layer",
        "query",
        "answer",
        "document",
        "section",
        "value",
        "result",
        "system",
        "user",
        "model",
        "latency",
        "page",
    ]
    return " ".join(rng.choice(vocab) for _ in range(n))


async def ask(
    client: openai.AsyncOpenAI,
    model: str,
    kind: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[Sample, str]:
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 24, "stream": True}
    kwargs["stream_options"] = {"include_usage": True}
    if tools:
        kwargs.update(tools=tools, tool_choice="none")
    try:
        stream: openai.AsyncStream[ChatCompletionChunk] = await client.chat.completions.create(**kwargs)
        replica = replica_id(stream.response.headers.get("x-kvroute-replica", "?"))
        ttft, text, usage = 0.0, [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not ttft:
                ttft = time.perf_counter() - t0
            text += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
    except openai.APIError:
        return Sample(kind, False, time.perf_counter() - t0, 0, 0, "?"), ""
    cached = usage.prompt_tokens_details.cached_tokens or 0 if usage and usage.prompt_tokens_details else 0
    return Sample(kind, True, ttft, usage.prompt_tokens if usage else 0, cached, replica), "".join(text)


async def agent_session(
    client: openai.AsyncOpenAI, model: str, system: str, seed: int, turns: int
) -> list[Sample]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    out = []
    for _ in range(turns):
        messages.append({"role": "user", "content": words(rng, 60)})
        sample, reply = await ask(client, model, "agent", messages, TOOLS)
        out.append(sample)
        messages.append({"role": "assistant", "content": reply})
    return out


async def documents(client: openai.AsyncOpenAI, model: str, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    docs = [words(rng, 6000) for _ in range(2)]
    out = []
    for round_ in range(3):
        for doc in docs:
            msgs = [{"role": "user", "content": f"{doc}\n\nQuestion {round_}: {words(rng, 12)}"}]
            out.append((await ask(client, model, "document", msgs))[0])
    return out


def summary(samples: list[Sample], replicas: Sequence[str], scale: float) -> dict[str, str]:
    """One column of the printed table; TTFTs are shown in emulated seconds (real seconds / scale)."""
    ok = [s for s in samples if s.ok]
    ttfts = sorted(s.ttft_s / scale for s in ok)
    prompt = sum(s.prompt_tokens for s in ok)
    cached = sum(s.cached_tokens for s in ok)
    share = Counter(s.replica for s in ok)

    def pct(q: float) -> float:
        return ttfts[min(len(ttfts) - 1, round(q * (len(ttfts) - 1)))] if ttfts else float("nan")

    mean = statistics.fmean(ttfts) if ttfts else float("nan")
    return {
        "requests": f"{len(samples)}",
        "errors": str(len(samples) - len(ok)),
        "TTFT mean (emulated s)": f"{mean:.2f}",
        "TTFT p50 / p99 (emulated s)": f"{pct(0.5):.2f} / {pct(0.99):.2f}",
        "cached tokens (token-weighted)": f"{cached / prompt if prompt else 0:.1%}",
        "requests per replica": " / ".join(str(share.get(r, 0)) for r in replicas),
    }


async def workload(base: str, args: argparse.Namespace) -> list[Sample]:
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="demo", max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        system = "You are a coding agent. Use the tools when useful. " + words(random.Random(args.seed), 1500)
        jobs = [agent_session(client, model, system, args.seed + i, 4) for i in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*jobs, documents(client, model, args.seed)), 120)
    return [s for batch in results for s in batch]


async def one_policy(policy: str, args: argparse.Namespace) -> dict[str, str]:
    """Fresh emulated replicas (so no cache leaks between policies), `kvroute serve`, the workload."""
    flags = [*EMU_ARGS, "--emu-time-scale", str(args.time_scale)]
    async with EmulatorFleet(3, flags) as fleet:
        gateway = kvroute(policy, "--seed", str(args.seed), "--health-interval", "1.0")
        async with system_process(gateway, fleet.urls, args.logs / f"{gateway.name}.log") as proc:
            samples = await workload(proc.urls[0], args)
    return summary(samples, [replica_id(u) for u in fleet.urls], args.time_scale)


async def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        print("kvroute demo: --policies names no policy", file=sys.stderr)
        return 2
    print(
        f"kvroute demo: 3 emulated SGLang replicas (HiCache write_back, time scale {args.time_scale}); "
        "4 agent sessions x 4 turns sharing a system prompt + tools, 2 long documents x 3 questions; "
        f"policies: {', '.join(policies)}",
        flush=True,
    )
    try:
        columns = {p: await one_policy(p, args) for p in policies}
    except NotReady as exc:  # e.g. a policy the gateway does not know: its own error is in the tail
        print(f"kvroute demo: the gateway did not start: {exc}", file=sys.stderr)
        return 2
    rows = list(next(iter(columns.values())))
    width = max(len(r) for r in rows)
    colw = max(18, *(len(v) for c in columns.values() for v in c.values()))
    print(f"  {'':<{width}}  " + "  ".join(f"{p:>{colw}}" for p in policies))
    for r in rows:
        print(f"  {r:<{width}}  " + "  ".join(f"{columns[p][r]:>{colw}}" for p in policies))
    print(f"  wall time {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if all(c["errors"] == "0" for c in columns.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kvroute demo", description="gateway + 3 emulated replicas + a short workload"
    )
    p.add_argument("--policies", default="cost,round_robin", help="comma-separated, run side by side")
    p.add_argument("--time-scale", type=float, default=0.1, help="emulated seconds x this = real seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--logs", type=Path, default=Path(tempfile.gettempdir()) / "kvroute-demo", help="gateway logs here"
    )
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
