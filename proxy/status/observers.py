"""The gateway's self-observation: the fleet collector and the replica scraper, started with the app, and
the tokenizer's metrics (``observe_tokenizer``, wired when the app is built).

``observe_ctx`` (a cleanup_ctx, after the health poller so the first scrape finds healthy replicas)
registers ``proxy.observe.collectors.FleetCollector`` on the gateway's registry and runs
``proxy.fleet.replica_metrics.ReplicaScraper`` as a background task at ``scrape_interval(health_interval)``;
the task is cancelled at shutdown. Requests never wait for it (``proxy/fleet/replica_metrics.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from proxy.context import GATEWAY
from proxy.exact.tokenizer import PromptTokenizer
from proxy.fleet.replica_metrics import scrape_interval
from proxy.observe.collectors import FleetCollector
from proxy.observe.exposition import FastHistogram
from proxy.observe.metrics import GatewayMetrics

TOKENIZE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


async def observe_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    gw.metrics.watch(FleetCollector(gw.fleet, gw.router))
    scraper = gw.metrics.scraper
    scraper.set_interval(scrape_interval(gw.settings.health_interval))
    scraper.on_sample = lambda replica, sample: gw.fleet.note_scrape(replica, sample.gauges)
    task = asyncio.get_running_loop().create_task(scraper.run(gw.up))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def observe_tokenizer(metrics: GatewayMetrics, tok: PromptTokenizer | None) -> None:
    """``kvroute_tokenizer{field}`` (enabled 0/1, requests tokenized, already ids, fallbacks by reason),
    ``kvroute_tokenizer_prefix_cache{field}`` (entries, ids, hits, misses, hit_ratio, evicted),
    ``kvroute_tokenizer_paragraph_cache{field}`` (the same fields, per paragraph),
    ``kvroute_tokenize_seconds{mode}`` (inline or thread: parse to token ids) and ``/status["tokenizer"]``."""
    metrics.register_source("tokenizer", lambda: _fields(tok), "The gateway's tokenizer", "field")
    metrics.register_section("tokenizer", lambda: _status(tok))
    if tok is None:
        return
    metrics.register_source(
        "tokenizer_prefix_cache", tok.cache.status, "Cache of rendered conversation prefixes", "field"
    )
    if tok.paragraphs is not None:
        metrics.register_source(
            "tokenizer_paragraph_cache", tok.paragraphs.status, "Cache of long turns' paragraphs", "field"
        )
    seconds = metrics.add(
        FastHistogram("kvroute_tokenize_seconds", "A prompt to token ids", ("mode",), TOKENIZE_BUCKETS)
    )
    tok.observe = lambda mode, s: seconds.observe(s, mode)


def _fields(tok: PromptTokenizer | None) -> dict[str, float]:
    if tok is None:
        return {"enabled": 0.0}
    return {"enabled": 1.0, "tokenized": 0.0, "ids": 0.0, **{k: float(v) for k, v in tok.counts.items()}}


def _status(tok: PromptTokenizer | None) -> dict[str, Any]:
    if tok is None:
        return {"enabled": False}
    counts = {"tokenized": 0, "ids": 0, **tok.counts}
    fallback = {k.removeprefix("fallback_"): v for k, v in counts.items() if k.startswith("fallback_")}
    return {
        "enabled": True, "chat_template": tok.template is not None, "tokenized": counts["tokenized"],
        "ids": counts["ids"], "fallback": fallback, "prefix_cache": tok.cache.status(),
        "paragraph_cache": tok.paragraphs.status() if tok.paragraphs is not None else None,
    }  # fmt: skip
