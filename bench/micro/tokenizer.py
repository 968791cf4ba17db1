"""Micro-benchmark of exact mode's tokenizing cost per request (prints numbers; not a test).

    python -m bench.micro.tokenizer [--tokenizer emulator/model_bpe] [--repeat 20] [--turns 20]

1. **Cold**: a chat of a system document and one question (~1K, 8K, 32K, 128K tokens of the seeded
   pseudo-English of ``bench.workloads.text``) through ``PromptTokenizer.tokenized`` with an empty prefix
   cache (render the ChatML template, encode, build the ``TokenPrompt``), then ``Router.prepare`` of the
   result (``token_block_hashes`` per ``token_block`` ids); next to ``Router.prepare`` of the same chat with
   text keys (canonical render + 256-byte blocks), the cost without a tokenizer. Median and p99 ms.
2. **Growing conversation**: an 8K-token system document, then ``--turns`` user turns of ~300 tokens
   each with ~100-token assistant answers; every turn is one request, tokenized with the prefix cache
   (only the new turns are encoded) and, for comparison, cold. Per turn: ms with the cache, ms cold,
   and the cache's hit ratio at the end.
3. **Event loop**: while a 128K-token chat is tokenized through the thread path, a 1 ms ticker on the
   event loop measures its worst lag (what other requests wait), against the same encode inline.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from bench.workloads.text import WordSource
from proxy.exact.prefix_cache import PrefixCache
from proxy.exact.tokenizer import PromptTokenizer
from proxy.front.openai import parse_request
from proxy.types import ParsedRequest, Route
from routing.config import RoutingConfig
from routing.router import Router

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "emulator" / "model_bpe"


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


async def _ms(fn: Callable[[], Awaitable[object] | object], repeat: int) -> tuple[float, float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        if asyncio.iscoroutine(result):
            await result
        out.append((time.perf_counter() - t0) * 1e3)
    return _stats(out)


def _parsed(messages: list[dict[str, Any]]) -> ParsedRequest:
    return parse_request(Route.CHAT, orjson.dumps({"model": "m", "messages": messages}))


def _fresh(tok: PromptTokenizer) -> PromptTokenizer:
    return tok.with_cache(PrefixCache())


async def bench_cold(tok: PromptTokenizer, words: WordSource, repeat: int) -> None:
    router = Router(RoutingConfig())
    print("cold (empty prefix cache): tokenize | prepare token keys | prepare text keys (no tokenizer)")
    for tokens in (1024, 8192, 32768, 131072):
        msgs = [{"role": "system", "content": words.sentences(tokens)}, {"role": "user", "content": "Why?"}]
        parsed = _parsed(msgs)
        exact = await _fresh(tok).tokenized(parsed)
        ids = len(getattr(exact.routing.prompt, "ids", ()))
        n = max(3, repeat // (1 + tokens // 16384))
        t_tok = await _ms(lambda p=parsed: _fresh(tok).tokenized(p), n)  # type: ignore[misc]
        t_keys = await _ms(lambda e=exact: router.prepare(e.routing), n)  # type: ignore[misc]
        t_text = await _ms(lambda p=parsed: router.prepare(p.routing), n)  # type: ignore[misc]
        size = len(orjson.dumps(msgs)) / 1e3
        print(
            f"  {ids:>7,} ids ({size:>5.0f} KB): {t_tok[0]:7.2f} ms (p99 {t_tok[1]:.2f})"
            f" | {t_keys[0]:6.2f} ms | {t_text[0]:6.2f} ms"
        )


async def bench_growing(tok: PromptTokenizer, words: WordSource, turns: int) -> None:
    warm, router = _fresh(tok), Router(RoutingConfig())
    msgs: list[dict[str, Any]] = [{"role": "system", "content": words.sentences(8192)}]
    cached, cold, keyed = [], [], []
    for _ in range(turns):
        msgs.append({"role": "user", "content": words.sentences(300)})
        parsed = _parsed(list(msgs))
        t0 = time.perf_counter()
        out = await warm.tokenized(parsed)
        cached.append((time.perf_counter() - t0) * 1e3)
        keyed.append((await _ms(lambda o=out: router.prepare(o.routing), 1))[0])  # type: ignore[misc]
        cold.append((await _ms(lambda p=parsed: _fresh(tok).tokenized(p), 1))[0])  # type: ignore[misc]
        assert out.routing.prompt == (await _fresh(tok).tokenized(parsed)).routing.prompt
        msgs.append({"role": "assistant", "content": words.sentences(100)})
    ids = len(getattr(out.routing.prompt, "ids", ()))
    st = warm.cache.status()
    print(f"growing conversation: {turns} turns on an 8K-token system document, last request {ids:,} ids")
    print(
        f"  tokenize with the prefix cache: median {_stats(cached)[0]:.2f} ms, last turn {cached[-1]:.2f} ms"
    )
    print(f"  tokenize cold:                  median {_stats(cold)[0]:.2f} ms, last turn {cold[-1]:.2f} ms")
    print(f"  prepare token keys:             median {_stats(keyed)[0]:.2f} ms, last turn {keyed[-1]:.2f} ms")
    print(f"  cache hit ratio {st['hit_ratio']:.2f}, {st['entries']} entries, {st['ids']:,} ids held")


async def _lag(tok: PromptTokenizer, parsed: ParsedRequest, threaded: bool) -> tuple[float, float]:
    """(the worst event-loop lag of a 1 ms ticker in ms, the tokenizing time in ms)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, (time.perf_counter() - t0) * 1e3 - 1.0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    fresh = _fresh(tok)
    t0 = time.perf_counter()
    if threaded:
        await fresh.tokenized(parsed)
    else:
        fresh.tokenized_now(parsed)
    took = (time.perf_counter() - t0) * 1e3
    await asyncio.sleep(0.01)
    done = True
    await task
    return worst, took


async def bench_loop(tok: PromptTokenizer, words: WordSource) -> None:
    parsed = _parsed([{"role": "user", "content": words.sentences(131072)}])
    for threaded in (False, True):
        worst, took = await _lag(tok, parsed, threaded)
        mode = "thread (asyncio.to_thread)" if threaded else "inline"
        print(
            f"event loop, 128K-token chat {mode}: tokenized in {took:.0f} ms, worst loop lag {worst:.1f} ms"
        )


async def _main(args: argparse.Namespace) -> None:
    tok = PromptTokenizer.load(args.tokenizer)
    words = WordSource(7)
    await bench_cold(tok, words, args.repeat)
    await bench_growing(tok, words, args.turns)
    await bench_loop(tok, words)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tokenizer", default=str(DEFAULT_DIR), help="a tokenizer directory")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--turns", type=int, default=20)
    asyncio.run(_main(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
