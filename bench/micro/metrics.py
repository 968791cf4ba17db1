"""Micro-benchmark of the gateway's /metrics rendering: proxy.observe.exposition against prometheus-client's
``generate_latest`` on the same registry, side by side in one run (prints numbers; not a test).

    python -m bench.micro.metrics [--replicas 16] [--repeat 200]

A kvroute gateway runs in this process (``proxy.server.build_app`` on a loopback port, policy
round_robin) in front of ``--replicas`` emulated replicas (one ``python -m emulator`` process, with
--enable-metrics and HiCache), gets the same traffic as the /metrics scrape of ``bench/overhead/scrape.py``
(whole and streamed chat, streamed completions, on every replica) and scrapes every replica once. Then
``GatewayMetrics.render()`` (what /metrics serves) and ``generate_latest(registry)`` take turns
``--repeat`` times: CPU time per call (``time.process_time``), median and p99, and the ratio of the
medians. Both see the same families (``tests/proxy/observe/test_exposition.py`` compares their samples).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import generate_latest

from bench.overhead.requests import pct_ms
from bench.overhead.scrape import SCRAPE_EMULATOR_ARGS
from bench.systems.fleet import EmulatorFleet
from proxy.config.settings import Settings
from proxy.context import GATEWAY
from proxy.runtime.serving import GatewayRunner
from proxy.server import build_app


async def _traffic(url: str, model: str, replicas: int) -> None:
    chat = {"model": model, "messages": [{"role": "user", "content": "Count to 8."}], "max_tokens": 8}
    bodies = [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", chat | {"stream": True}),
        ("/v1/completions", {"model": model, "prompt": "Count to 8.", "max_tokens": 8, "stream": True}),
    ]
    async with aiohttp.ClientSession() as s:
        for path, body in bodies:
            for _ in range(4 * replicas):
                async with s.post(url + path, data=orjson.dumps(body)) as r:
                    await r.read()


async def measure(replicas: int, repeat: int) -> dict[str, list[float]]:
    async with EmulatorFleet(replicas, SCRAPE_EMULATOR_ARGS, Path("/dev/null")) as fleet:
        app = build_app(Settings(backends=tuple(fleet.urls), policy="round_robin", health_interval=30.0))
        runner = GatewayRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            gw = app[GATEWAY]
            await _traffic(url, sorted(gw.fleet.models())[0], replicas)
            await gw.metrics.scraper.scrape_all(gw.up)
            times: dict[str, list[float]] = {"proxy.observe.exposition": [], "generate_latest": []}
            calls: dict[str, Callable[[], bytes]] = {
                "proxy.observe.exposition": gw.metrics.render,
                "generate_latest": lambda: generate_latest(gw.metrics.registry),
            }
            for _ in range(repeat):
                for name, call in calls.items():
                    t0 = time.process_time()
                    call()
                    times[name].append(time.process_time() - t0)
            return times
        finally:
            await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.micro.metrics", description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    times = asyncio.run(measure(args.replicas, args.repeat))
    p50 = {name: pct_ms(xs, 0.5) for name, xs in times.items()}
    for name, xs in times.items():
        p99 = pct_ms(xs, 0.99)
        print(
            f"{name:<18} {args.replicas} replicas  CPU per render: p50 {p50[name]:.2f} ms  p99 {p99:.2f} ms"
        )
    ratio = p50["generate_latest"] / p50["proxy.observe.exposition"]
    print(f"generate_latest / proxy.observe.exposition (medians): {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
