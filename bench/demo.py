"""``kvroute demo``: the gateway in front of 3 emulated SGLang replicas, a short scripted workload
through the official ``openai`` SDK, and a printed summary.

What it runs (seeded, ~10-20 s of wall time):
- 3 emulated replicas (HiCache ``write_back``, cache report, metrics; a time scale that makes a
  cold 40K-token prefill take ~0.6 s instead of 15 s);
- the gateway in-process on a free port (``proxy.server.build_app``), policy from ``--policy``;
- 4 agent sessions that share a system prompt and tool schemas, 4 streamed turns each (each turn
  extends its own history), running concurrently;
- 2 long documents, each asked 3 different questions (streamed);
Each request records its TTFT (first content chunk), prompt and cached tokens (``include_usage``) and
the replica that served it (``x-kvroute-replica``). The summary prints requests, errors, mean/p50/p99
TTFT, the token-weighted cached ratio and the per-replica share. Everything started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import openai
from aiohttp import web
from openai.types.chat import ChatCompletionChunk

from emulator.launcher import EmulatorFleet, free_ports
from proxy.server import build_app
from proxy.settings import Settings

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
        replica = stream.response.headers.get("x-kvroute-replica", "?")
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


def summary(samples: list[Sample], replicas: Sequence[str], wall: float) -> str:
    ok = [s for s in samples if s.ok]
    ttfts = sorted(s.ttft_s * 1000 for s in ok)
    prompt = sum(s.prompt_tokens for s in ok)
    cached = sum(s.cached_tokens for s in ok)
    share = Counter(s.replica for s in ok)

    def pct(q: float) -> float:
        return ttfts[min(len(ttfts) - 1, round(q * (len(ttfts) - 1)))] if ttfts else float("nan")

    rows = [
        (
            "requests",
            f"{len(samples)} ({sum(s.kind == 'agent' for s in samples)} agent turns, "
            f"{sum(s.kind == 'document' for s in samples)} document questions)",
        ),
        ("errors", str(len(samples) - len(ok))),
        (
            "TTFT mean / p50 / p99",
            f"{statistics.fmean(ttfts) if ttfts else float('nan'):.1f} / {pct(0.5):.1f} / {pct(0.99):.1f} ms",
        ),
        (
            "cached tokens (token-weighted)",
            f"{cached} of {prompt} prompt tokens = {cached / prompt if prompt else 0:.1%}",
        ),
        *(
            (f"share {r}", f"{share.get(r, 0)} requests ({share.get(r, 0) / max(1, len(ok)):.0%})")
            for r in replicas
        ),
        ("wall time", f"{wall:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


async def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    async with EmulatorFleet(3, [*EMU_ARGS, "--emu-time-scale", str(args.time_scale)]) as fleet:
        settings = Settings(
            port=free_ports(1)[0],
            backends=tuple(fleet.urls),
            policy=args.policy,
            seed=args.seed,
            health_interval=1.0,
        )
        runner = web.AppRunner(build_app(settings), handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.host, settings.port).start()
            base = f"http://{settings.host}:{settings.port}"
            print(
                f"kvroute demo: gateway {base} (policy {args.policy}) over {', '.join(fleet.urls)}",
                flush=True,
            )
            async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="demo", max_retries=0) as client:
                model = (await client.models.list()).data[0].id
                system = "You are a coding agent. Use the tools when useful. " + words(
                    random.Random(args.seed), 1500
                )
                jobs = [agent_session(client, model, system, args.seed + i, 4) for i in range(4)]
                results = await asyncio.wait_for(
                    asyncio.gather(*jobs, documents(client, model, args.seed)), 120
                )
        finally:
            await runner.cleanup()
        samples = [s for batch in results for s in batch]
        print(summary(samples, fleet.urls, time.perf_counter() - t0), flush=True)
    return 0 if all(s.ok for s in samples) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kvroute demo", description="gateway + 3 emulated replicas + a short workload"
    )
    p.add_argument("--policy", default="least_load")
    p.add_argument("--time-scale", type=float, default=0.04, help="emulated seconds x this = real seconds")
    p.add_argument("--seed", type=int, default=0)
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
