"""Micro-benchmark of the routing hot path and the cache model's memory (prints numbers; not a test).

    python -m bench.micro.routing [--replicas 4] [--blocks 10000000] [--repeat 50]

1. **Hash + match + route**: a 128K-token chat prompt (~512 KB of canonical text at 4 bytes per token)
   goes through ``Router.route`` (render, hash into 256-byte blocks, sync, match every replica, the
   cost policy's decision, record) and ``finish``, on fleets of ``--replicas`` sizes (default 4, 16, 64,
   256) where one replica holds the whole prompt on GPU and every other one its first half on host
   (a GPU run and a host run to find on every replica). Median and p99 over ``--repeat`` runs.
2. **Memory**: the resident-set growth of a ``CacheModel`` filled with ``--blocks`` distinct blocks
   spread over ``--replicas`` write_back replicas (GPU + host tiers), per block and in total.
   (Measured with /proc/self/status VmRSS on Linux, tracemalloc elsewhere.)

Targets (issues 5 and 9): hash + match + route of 128K tokens <= 1 ms at 16 replicas and <= 2 ms at
256; 10M blocks <= 1 GB.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from proxy.runtime.malloc import tune_malloc
from routing.cache_model import CacheModel
from routing.canonical import render
from routing.config import RoutingConfig
from routing.hashing import block_hashes
from routing.prompt import ChatPrompt, Message, PromptRequest
from routing.router import Router
from routing.types import ReplicaState, Report, RoutingRequest

PROMPT_TOKENS = 128 * 1024


def _words(rng: random.Random, n_chars: int) -> str:
    vocab = ["alpha", "beta", "gamma", "delta", "kv", "cache", "route", "token", "prefix", "replica"]
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(vocab)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def _prompt(rng: random.Random) -> PromptRequest:
    system = Message("system", _words(rng, 4000))
    user = Message("user", _words(rng, PROMPT_TOKENS * 4 - 4000))
    return PromptRequest("m", ChatPrompt((system, user)))


def _fleet(router: Router, req: PromptRequest, replicas: int) -> list[ReplicaState]:
    """r0 holds the whole prompt on GPU, every other replica its first half on host only."""
    states = [
        ReplicaState(id=f"r{i}", gpu_tokens=10_000_000, host_tokens=20_000_000, write_policy="write_back")
        for i in range(replicas)
    ]
    router.cache.sync(states)
    hashes = router.route(req, states[:1]).request.block_hashes
    for s in states[1:]:
        tiers = router.cache.tiers(s.id)
        assert tiers is not None
        tiers.host.touch_all(hashes[: len(hashes) // 2][::-1])
    return states


def bench_hot_path(replicas: int, repeat: int) -> dict[str, float]:
    """Median ms of hashing and of the whole ``Router.route`` (+ finish) of one 128K-token prompt."""
    cfg = RoutingConfig()
    router = Router(cfg)
    req = _prompt(random.Random(1))
    text = render(req.prompt).encode()
    states = _fleet(router, req, replicas)

    def route() -> object:
        ticket = router.route(req, states)
        router.finish(ticket, Report(ok=True))
        return ticket

    hash_ms, _ = _timed(lambda: block_hashes("m", text, "", cfg.block_chars, cfg.max_blocks), repeat)
    route_ms, route_p99 = _timed(route, repeat)
    ticket = router.route(req, states)
    m = {c.state.id: c.match for c in ticket.candidates}
    print(
        f"{replicas:>4} replicas: hash {hash_ms:6.3f} ms   hash + match + route {route_ms:6.3f} ms "
        f"(p99 {route_p99:6.3f})   r0 {m['r0'].gpu_tokens:,.0f} GPU tokens, "
        f"r1 {m['r1'].host_tokens if 'r1' in m else 0:,.0f} host tokens"
    )
    return {"replicas": replicas, "hash_ms": hash_ms, "route_ms": route_ms, "route_p99_ms": route_p99}


def _rss_mb() -> float | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def bench_memory(replicas: int, blocks: int) -> None:
    per_replica = blocks // replicas
    # GPU holds a third, host two thirds: the write_back steady state after eviction pressure
    gpu_tokens, host_tokens = per_replica // 3, per_replica - per_replica // 3
    cfg = RoutingConfig(block_chars=4, chars_per_token=4.0, model_budget_blocks=blocks)
    states = [
        ReplicaState(id=f"r{i}", gpu_tokens=gpu_tokens, host_tokens=host_tokens, write_policy="write_back")
        for i in range(replicas)
    ]
    use_rss = _rss_mb() is not None
    gc.collect()
    if not use_rss:
        tracemalloc.start()
    before = _rss_mb() or 0.0
    model = CacheModel(cfg, block_tokens=1.0)
    model.sync(states)
    rng = random.Random(2)
    chunk = 4096
    t0 = time.perf_counter()
    for i in range(0, blocks, chunk):
        hashes = tuple(rng.getrandbits(64) for _ in range(chunk))
        r = RoutingRequest("m", hashes, prompt_tokens=chunk + 1, block_tokens=1.0)
        rec = model.record(r, states[(i // chunk) % replicas].id)
        assert rec is not None
        model.settle(rec, Report(ok=True, prompt_tokens=chunk + 1, cached_tokens=0))
    fill_s = time.perf_counter() - t0
    gc.collect()
    if use_rss:
        grown = (_rss_mb() or 0.0) - before
    else:
        grown = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
    held = model.blocks()
    live = _live_bytes(model, states) / 2**20
    print(f"cache model: {held:,} blocks held over {replicas} replicas (GPU + host, write_back)")
    print(
        f"  process memory growth {grown:,.0f} MiB = {grown * 2**20 / max(1, held):.0f} B/block"
        f"  (fill {fill_s:.1f} s)"
    )
    print(
        f"  live objects (dict tables + int keys) {live:,.0f} MiB = {live * 2**20 / max(1, held):.0f} B/block"
    )


def _live_bytes(model: CacheModel, states: list[ReplicaState]) -> int:
    """Bytes of the tier tables plus each distinct key object once (what the model itself keeps alive)."""
    total, seen = 0, set()
    for s in states:
        tiers = model.tiers(s.id)
        if tiers is None:
            continue
        for lru in (tiers.gpu, tiers.host, tiers.storage):
            total += lru.table_bytes()
            for block in lru.order():
                if id(block) not in seen:
                    seen.add(id(block))
                    total += sys.getsizeof(block)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--replicas", default="4,16,64,256", help="fleet sizes for the hot path")
    ap.add_argument("--memory-replicas", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args(argv)
    tuned = tune_malloc()  # as ``kvroute serve`` does at start (proxy/runtime/malloc.py)
    print(f"glibc malloc thresholds raised: {tuned}")
    for n in (int(x) for x in args.replicas.split(",")):
        bench_hot_path(n, args.repeat)
    if not args.skip_memory:
        bench_memory(args.memory_replicas, args.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
