"""``kvroute ab URL [URL ...]``: seed 2's cold/hot A/B, side by side for each URL.

Per URL, ``--runs`` times (3): ``POST /flush_cache`` (retried with ``?timeout=`` while the server is busy,
see diag/client.py), then the prompt cold, then the same prompt hot (no flush in between). Every run and
every URL sends the same prompt (one seed), so two servers that differ only in their HiCache flags
(seed 2: ``--enable-hierarchical-cache`` or not) are compared like for like. Reported per phase: the
median TTFT over runs, prefill throughput = prompt tokens / median TTFT, and the last run's cached-token
report. Seed 2 (128K tokens): cold ~192 s with or without HiCache; hot ~2.65 s from the host pool.

A cold run that still found most of the prompt cached means the flush did not clear it, and a hot run
that found little cached means the cache did not keep it; both are reported as notes.
"""

from __future__ import annotations

import argparse
import asyncio

from diag import report
from diag.client import DiagError, Generation, SGLangClient
from diag.options import add_common, plotting, positive_float, positive_int, run_command, seed_of
from diag.progress import Progress
from diag.prompts import Prompt, PromptMaker
from diag.results import AbResult, Phase
from diag.target import discover

DEFAULT_RUNS = 3
DEFAULT_FLUSH_TIMEOUT_S = 30.0
MOSTLY = 0.5  # share of the prompt that counts as "cached"


def phase(name: str, sends: list[Generation], planned: int) -> Phase:
    tokens = sends[-1].prompt_tokens or planned
    return Phase(name, tuple(g.ttft_s for g in sends), tokens, sends[-1])


def notes(cold: list[Generation], hot: list[Generation], tokens: int) -> tuple[str, ...]:
    out = []
    for i, g in enumerate(cold, 1):
        if (g.cached_tokens or 0) >= MOSTLY * tokens:
            out.append(
                f"cold run {i} found {g.cached_tokens:,} cached tokens: the flush did not clear the cache"
            )
    for i, g in enumerate(hot, 1):
        if g.cached_tokens is not None and g.cached_tokens < MOSTLY * tokens:
            out.append(
                f"hot run {i} found only {g.cached_tokens:,} cached tokens: the cache did not keep the prompt"
            )
    return tuple(out)


async def runs(client: SGLangClient, prompt: Prompt, n: int, flush_timeout: float,
               progress: Progress) -> tuple[list[Generation], list[Generation]]:  # fmt: skip
    cold: list[Generation] = []
    hot: list[Generation] = []
    for i in range(1, n + 1):
        await client.flush_cache(flush_timeout)
        progress.note(f"run {i}/{n}: cache flushed")
        cold.append(await progress.request(f"run {i}/{n} cold", prompt.tokens, client.generate(prompt.body)))
        hot.append(await progress.request(f"run {i}/{n} hot", prompt.tokens, client.generate(prompt.body)))
    return cold, hot


async def ab_one(url: str, args: argparse.Namespace, seed: int, progress: Progress) -> AbResult:
    async with SGLangClient(url, args.timeout, args.api_key, args.status_key) as client:
        target = await discover(client)
        progress.note(target.describe())
        limits = [p.max_input_tokens for p in target.pools if p.max_input_tokens is not None]
        if limits and args.context_tokens > min(limits):
            raise DiagError(
                f"--context-tokens {args.context_tokens:,} exceeds max_req_input_len {min(limits):,}"
            )
        maker = await PromptMaker.create(client, seed, args.max_new_tokens)
        prompt = maker.make(args.context_tokens)
        cold, hot = await runs(client, prompt, args.runs, args.flush_timeout, progress)
    tokens = cold[-1].prompt_tokens or prompt.tokens
    return AbResult(target, args.runs, seed, tokens, phase("cold", cold, tokens), phase("hot", hot, tokens),
                    notes(cold, hot, tokens))  # fmt: skip


async def ab(args: argparse.Namespace, progress: Progress) -> list[AbResult]:
    seed = seed_of(args)
    return [await ab_one(url, args, seed, progress) for url in args.url]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute ab",
        description="Seed 2's cold/hot A/B: flush, cold prompt, hot re-send; medians over --runs, per URL.",
    )
    add_common(p, many_urls=True)
    p.add_argument(
        "--runs", type=positive_int, default=DEFAULT_RUNS, help="runs per URL (3); medians are reported"
    )
    p.add_argument("--flush-timeout", type=positive_float, default=DEFAULT_FLUSH_TIMEOUT_S,
                   help="seconds to wait for a busy server to accept /flush_cache (30)")  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    progress = Progress("kvroute ab", enabled=not args.quiet)

    def body() -> None:
        results = asyncio.run(ab(args, progress))
        print(report.ab_json(results) if args.json else report.ab_text(results))
        if args.plot is not None:
            plotting().ab_png(results, args.plot)

    return run_command("kvroute ab", body)
