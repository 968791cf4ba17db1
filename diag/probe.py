"""``kvroute probe URL``: seed 1's eviction-reuse probe against an SGLang server or a kvroute gateway.

    1. R cold          a unique context R (``--context-tokens``; by default half the smallest GPU pool,
                       at most seed 1's 40K tokens, said in a note)
    2. pressure        unique contexts sized from R's replica's pools (diag/pressure.py): enough to push R
                       out of the GPU pool, not enough to push it out of the host pool
    3. R after eviction  the host-pool test: ~0.026 x cold when HiCache reuses the host copy (seed 1:
                       15.4 s -> 0.4 s), ~1 x cold when it does not (write_through on a hybrid model)
    4. R again         now on the GPU: ~0.0065 x cold (0.1 s); a cheap GPU hit, so it is sent ``--again``
                       times (3) and the fastest send is reported: noise (a scheduling hiccup, a busy
                       network) only ever adds time, and on a 0.1 s request it is a large share

All four are streamed ``/generate`` requests with a small ``max_new_tokens``: the native route reports
``cached_tokens`` and the per-tier ``cached_tokens_details`` (device/host) in every response without
``--enable-cache-report``, where ``/v1/completions`` reports only a total, only with that flag. The host
pool's use (``sglang:hicache_host_used_tokens``) is read before step 1, after step 2 and at the end.

Through a kvroute gateway (``/status``), R and the pressure carry one ``x-session-id`` so the gateway's
session affinity keeps them on one replica (the pressure counts only where ``x-kvroute-replica`` says it
landed); steps 3 and 4 carry none, so the gateway's own routing decides where R goes back.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from diag import report
from diag.client import Generation, SGLangClient
from diag.metrics import read_host_used
from diag.options import (
    DEFAULT_TIMEOUT_S,
    add_common,
    plotting,
    positive_int,
    run_command,
    seed_of,
)
from diag.pressure import Plan, check_context, plan_pressure, sized_context
from diag.progress import Progress
from diag.prompts import Prompt, PromptMaker
from diag.results import ProbeResult
from diag.target import Pool, Target, discover
from diag.verdict import judge

SESSION_HEADER = "x-session-id"


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    context_tokens: int | None = None  # None: sized from the pools (diag.pressure.sized_context)
    seed: int = 0
    max_new_tokens: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    again: int = 3  # step-4 sends; the fastest is reported
    api_key: str | None = None
    status_key: str | None = None  # a protected kvroute gateway's /status


class Probe:
    def __init__(self, client: SGLangClient, target: Target, maker: PromptMaker, progress: Progress) -> None:
        self.client, self.target, self.maker, self.progress = client, target, maker, progress
        self.session = {SESSION_HEADER: f"kvroute-probe-{maker.seed:x}"} if target.gateway else {}

    async def host_used(self) -> dict[str, int | None]:
        replicas = [p.replica for p in self.target.pools]
        values = await asyncio.gather(*(read_host_used(self.client, r) for r in replicas))
        return dict(zip(replicas, values, strict=True))

    async def send(self, label: str, tokens: int, body: bytes, sticky: bool) -> Generation:
        work = self.client.generate(body, self.session if sticky else None)
        return await self.progress.request(label, tokens, work)

    async def pressure(self, pool: Pool, plan: Plan) -> tuple[dict[str, int], int]:
        """Unique contexts until R's replica served ``plan.target_tokens`` (at most max_contexts)."""
        served: dict[str, int] = {}
        sent = 0
        while served.get(pool.replica, 0) < plan.target_tokens and sent < plan.max_contexts:
            prompt = self.maker.make(plan.context_tokens)
            sent += 1
            label = f"2/4 pressure {sent}/{plan.contexts}"
            g = await self.send(label, prompt.tokens, prompt.body, sticky=True)
            replica = g.replica or pool.replica
            served[replica] = served.get(replica, 0) + (g.prompt_tokens or prompt.tokens)
        return served, sent

    async def again(self, r: Prompt, n: int) -> tuple[Generation, tuple[float, ...]]:
        """Step 4, ``n`` times: the fastest send, and every send's TTFT."""
        sends = [await self.send(f"4/4 R again {i}/{n}", r.tokens, r.body, False) for i in range(1, n + 1)]
        return min(sends, key=lambda g: g.ttft_s), tuple(g.ttft_s for g in sends)

    async def run(self, opts: ProbeOptions) -> ProbeResult:
        context, note = sized_context(self.target.pools, opts.context_tokens)
        if note:
            self.progress.note(note)
        for pool in self.target.pools:
            check_context(pool, context)
        before = await self.host_used()
        r = self.maker.make(context)
        cold = await self.send("1/4 R cold", r.tokens, r.body, sticky=True)
        self.maker.calibrate(r.tokens, cold.prompt_tokens)
        pool = self.target.pool(cold.replica)
        fleet = len(self.target.pools)
        plan = plan_pressure(pool, cold.prompt_tokens or r.tokens, context, fleet, self.target.gateway)
        served, sent = await self.pressure(pool, plan)
        middle = await read_host_used(self.client, pool.replica)
        after = await self.send("3/4 R after eviction", r.tokens, r.body, sticky=False)
        again, again_ttfts = await self.again(r, opts.again)
        end = await read_host_used(self.client, pool.replica)
        verdict = judge(pool, plan, served.get(pool.replica, 0), cold, after, again)
        host = (before.get(pool.replica), middle, end)
        return ProbeResult(
            self.target, pool, plan, self.maker.seed, self.maker.token_ids, r.digest,
            cold, after, again, again_ttfts, served, sent, host, verdict, note,
        )  # fmt: skip


async def probe(url: str, opts: ProbeOptions, progress: Progress) -> ProbeResult:
    """Runs the whole probe against ``url``; raises DiagError with a one-line reason."""
    async with SGLangClient(url, opts.timeout_s, opts.api_key, opts.status_key) as client:
        target = await discover(client)
        progress.note(target.describe())
        maker = await PromptMaker.create(client, opts.seed, opts.max_new_tokens)
        return await Probe(client, target, maker, progress).run(opts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute probe",
        description="Seed 1's eviction-reuse probe: does the host pool (HiCache) give evicted prefixes back?",
    )
    add_common(p, context_help="tokens of R (default: half the smallest GPU pool, at most 40000)")
    p.add_argument("--again", type=positive_int, default=3, help="sends of step 4, fastest reported (3)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    progress = Progress("kvroute probe", enabled=not args.quiet)
    opts = ProbeOptions(
        args.context_tokens,
        seed_of(args),
        args.max_new_tokens,
        args.timeout,
        args.again,
        args.api_key,
        args.status_key,
    )

    def body() -> None:
        result = asyncio.run(probe(args.url, opts, progress))
        print(report.probe_json(result) if args.json else report.probe_text(result))
        if args.plot is not None:
            plotting().probe_png(result, args.plot)

    return run_command("kvroute probe", body)
