"""The floor: what no router can beat on a workload, from the emulator's own timing model.

Every request is served on an idle replica that holds, on GPU, every prefix any earlier request of
the workload sent (unbounded GPU pool, whole pages, no queueing, no reload): its TTFT is the prefill of
the rest of its prompt plus the fixed overhead (`emulator.timing.ttft_seconds`), and its cached tokens
are that shared prefix. A first-time document is a cold prefill even here; an agent turn still
computes its new tool output. Routers are measured against it: a target below the floor cannot be met
by any placement. Its prefill seconds (`work_s`, the TTFT without the overhead) are the work a perfect
router must still have done: `bench.workloads.load` divides their sum by the fleet's capacity to get the
offered load.

The prompt is rendered and tokenized exactly as the emulator does: `bench.systems.oracle`'s tokenizer, or, for
a fleet that tokenizes with a real tokenizer directory (`FleetSpec.tokenizer`, `--emu-tokenizer hf`:
`bench.exact`), the emulator's own `HfTokenizer` of that directory, whose byte-level BPE gives rag's
documents ~1.35x the tokens (without it `bench.exact` ran "load 0.6" at ~0.8 and its floor was short
by as much). A page counts once all of its tokens match (the emulator's radix tree matches whole pages)
within the request's cache namespace: its `cache_salt` + `extra_key`, as the emulator keys its radix tree
(rag_tenants: one document under two salts is two prefixes). Timed fleet events are ignored: on
rag_restart the floor is rag's, as if no replica had lost its cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.workloads.generators import Workload
from bench.workloads.tokens import SegmentTokenizer, token_ids
from emulator.hf_tokenizer import load
from emulator.openai_request import extra_key_of
from emulator.timing import PROFILES, ProfileTiming, ttft_seconds

DEFAULT_PROFILE = "rtx3090x2"


@dataclass(frozen=True, slots=True)
class FloorRequest:
    index: int
    tag: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    work_s: float  # prefill seconds of the uncached tail: a*(n - c) + b*(n^2 - c^2)/2
    cold_s: float  # prefill seconds with nothing cached: a*n + b*n^2/2


def namespace(body: Mapping[str, Any]) -> int:
    """Where a request's page chain starts: 0 without a cache namespace, else its hash (emulator:
    `cache_salt` then `extra_key`, concatenated, is the radix tree's root)."""
    key = extra_key_of(body)
    return 0 if key is None else hash(("namespace", key))


def floor(
    workload: Workload, page_size: int, profile: str = DEFAULT_PROFILE, tokenizer_path: str | None = None
) -> list[FloorRequest]:
    """Each request's ideal TTFT (modelled seconds), cached tokens and prefill work, in workload order;
    ``tokenizer_path``: the fleet's tokenizer directory, if its replicas tokenize with one."""
    timing = ProfileTiming(PROFILES[profile])
    tokenizer = load(tokenizer_path) if tokenizer_path else SegmentTokenizer()
    seen: set[int] = set()
    out = []
    for req in sorted(workload.requests, key=lambda r: r.index):
        ids = token_ids(tokenizer, req.path, dict(req.body)) or []
        pages, chain = [], namespace(req.body)
        for i in range(0, len(ids) - page_size + 1, page_size):
            chain = hash((chain, tuple(ids[i : i + page_size])))  # a page's key is its whole prefix
            pages.append(chain)
        cached = 0
        for page in pages:
            if page not in seen:
                break
            cached += page_size
        seen.update(pages)
        cached = min(cached, max(0, len(ids) - 1))
        ttft = ttft_seconds(timing, len(ids), cached, 0, 0)
        work, cold = timing.prefill_seconds(cached, len(ids)), timing.prefill_seconds(0, len(ids))
        out.append(FloorRequest(req.index, req.tag, len(ids), cached, ttft, work, cold))
    return out
