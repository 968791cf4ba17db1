"""Micro-benchmark of the routing hot path and the cache model's memory (prints numbers; not a test).

    python -m bench.micro_routing [--replicas 4] [--blocks 10000000] [--repeat 50]

1. **Hash + match**: a 128K-token chat prompt (~512 KB of canonical text at 4 bytes per token) is
   rendered, hashed into 256-byte blocks and matched against every replica of a cache model where one
   replica holds the whole prompt on GPU (a full-length scan) and the others hold its first half on
   host; also the whole ``route`` of the cost policy. Median and p99 over ``--repeat`` runs.
2. **Memory**: the resident-set growth of a ``CacheModel`` filled with ``--blocks`` distinct blocks
   spread over ``--replicas`` write_back replicas (GPU + host tiers), per block and in total.
   (Measured with /proc/self/status VmRSS on Linux, tracemalloc elsewhere.)

Targets (issue 5): hash + match of 128K tokens <= 1 ms; 10M blocks <= 1 GB.
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

from routing.cache_model import CacheModel
from routing.canonical import canonical_prompt
from routing.config import RoutingConfig
from routing.hashing import block_hashes
from routing.pipeline import Outcome
from routing.policies.cost import CostPolicy
from routing.types import Candidate, Decision, Reason, ReplicaState, RoutingRequest

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


def bench_hot_path(replicas: int, repeat: int) -> None:
    cfg = RoutingConfig()
    rng = random.Random(1)
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": _words(rng, 4000)},
            {"role": "user", "content": _words(rng, PROMPT_TOKENS * 4 - 4000)},
        ],
    }
    path = "/v1/chat/completions"
    text = canonical_prompt(path, body)
    hashes = block_hashes("m", text, "", cfg.block_chars, cfg.max_blocks)
    req = RoutingRequest("m", hashes, prompt_tokens=len(text) // 4, block_tokens=cfg.block_chars / 4)
    states = [
        ReplicaState(id=f"r{i}", gpu_tokens=10_000_000, host_tokens=20_000_000, write_policy="write_back")
        for i in range(replicas)
    ]
    model = CacheModel(cfg)
    model.sync(states)
    model.record(req, Decision(replica="r0", reason=Reason.LEAST_COST))
    for s in states[1:]:  # one request object per replica: recording the same one again is a retry
        half = RoutingRequest("m", hashes[: len(hashes) // 2], req.prompt_tokens // 2, req.block_tokens)
        model.record(half, Decision(replica=s.id, reason=Reason.LEAST_COST))
        tiers = model.tiers(s.id)
        assert tiers is not None
        for h in half.block_hashes:  # move the half to host: a host-tier run to scan as well
            tiers.host.touch(h)
        tiers.gpu.clear()
    policy = CostPolicy(cfg)

    def hash_only() -> object:
        return block_hashes("m", text, "", cfg.block_chars, cfg.max_blocks)

    def hash_and_match() -> object:
        h = block_hashes("m", text, "", cfg.block_chars, cfg.max_blocks)
        r = RoutingRequest("m", h, req.prompt_tokens, req.block_tokens)
        return model.match(r, states)

    def full_route() -> object:
        h = block_hashes("m", text, "", cfg.block_chars, cfg.max_blocks)
        r = RoutingRequest("m", h, req.prompt_tokens, req.block_tokens)
        m = model.match(r, states)
        return policy.route(r, [Candidate(s, m[s.id]) for s in states])

    print(
        f"prompt: {len(text):,} bytes canonical, {len(hashes)} blocks of {cfg.block_chars} B, "
        f"{replicas} replicas"
    )
    for name, fn in (
        ("render canonical", lambda: canonical_prompt(path, body)),
        ("hash", hash_only),
        ("hash + match", hash_and_match),
        ("hash + match + route", full_route),
    ):
        med, p99 = _timed(fn, repeat)
        print(f"  {name:<22} median {med:7.3f} ms   p99 {p99:7.3f} ms")
    m = model.match(req, states)
    print(f"  match r0: {m['r0']}   r1: {m['r1']}")


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
    model = CacheModel(cfg)
    model.sync(states)
    rng = random.Random(2)
    chunk = 4096
    t0 = time.perf_counter()
    for i in range(0, blocks, chunk):
        hashes = tuple(rng.getrandbits(64) for _ in range(chunk))
        r = RoutingRequest("m", hashes, prompt_tokens=chunk + 1, block_tokens=1.0)
        d = Decision(replica=states[(i // chunk) % replicas].id, reason=Reason.LEAST_COST)
        model.record(r, d)
        model.observe(Outcome(request=r, decision=d, ok=True, prompt_tokens=chunk + 1, cached_tokens=0))
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
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args(argv)
    bench_hot_path(args.replicas, args.repeat)
    if not args.skip_memory:
        bench_memory(args.replicas, args.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
