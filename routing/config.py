"""Routing configuration: one frozen value derived by the proxy from its settings.

``routing/`` never reads the environment or files; the proxy builds a ``RoutingConfig`` once at start
and passes it down. Every field has a documented default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PolicyName = Literal["cost", "round_robin", "least_load", "cache_aware", "consistent_hash"]
POLICY_NAMES: tuple[PolicyName, ...] = ("cost", "round_robin", "least_load", "cache_aware", "consistent_hash")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    policy: PolicyName = "cost"
    seed: int = 0  # seeds every tie-break, so a run is reproducible for a given request order

    # hashing (routing.hashing)
    block_chars: int = 256  # characters of canonical prompt per hashed block
    chars_per_token: float = 4.0  # initial estimate; learned from usage.prompt_tokens
    max_blocks: int = 16384  # blocks hashed per request (4M characters at the default block size)
    # exact keys (token-id prompts: the gateway's --tokenizer-path, or a body's input_ids): token ids per
    # hashed block (routing.hashing.token_block_hashes). A replica's KV events map onto these keys only
    # when this is a multiple of its page size (SGLang --page-size; 1 by default), so that every block
    # boundary is a page boundary.
    token_block: int = 16

    # cache model (routing.cache_model)
    model_budget_blocks: int = 10_000_000  # total blocks remembered over all replicas and tiers

    # cost policy (predicted TTFT, seconds); rates are starting points, learned online
    prefill_tokens_per_s: float = 4000.0
    host_load_tokens_per_s: float = 130_000.0
    storage_load_tokens_per_s: float = 20_000.0
    overhead_s: float = 0.05
    tie_rel_tol: float = 0.05  # predicted costs within 5% of the best are a tie (seeded draw among them)
    tie_abs_s: float = 0.005  # ... and so are costs within 5 ms of it
    session_overload_factor: float = (
        2.0  # a session yields when its replica's queue > this x the fleet's best
    )

    # decode speed (slot-wait term: when a replica's running slots are full, a new request waits for the
    # first decoding request to finish); learned per replica from streamed answers
    decode_s_per_token: float = 0.0073  # starting point: seconds per generated token at batch 1 (~137 tok/s)
    default_new_tokens: int = 256  # assumed output length when the request sets no max tokens

    # placement (routing.placement): the delay a request imposes on the ones arriving behind it on a
    # replica grows like 1 / (1 - utilization); utilization is capped here
    max_utilization: float = 0.95
    # the weight on what a copy of a shared prefix is worth to the requests that will share it
    # (routing.placement; 0: copies are priced by their cost alone)
    copy_worth: float = 4.0
    # a prefix's demand: the requests after which one request's share weighs half (routing.demand)
    demand_half_life: float = 200.0

    # new sessions avoid replicas holding more than this multiple of the fewest sessions any replica
    # holds, + 1, where their predicted TTFT is within session_overload_factor of the pick's (0 disables)
    session_spread_factor: float = 1.3

    # session affinity (routing.session): sessions remembered, least recently used forgotten first
    max_sessions: int = 100_000

    # sglang-style cache_aware baseline (sglang-router 0.3.2 Python defaults)
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    cache_aware_max_tree_chars: int = 1 << 26  # per replica, like sglang-router's --max-tree-size

    # least_load: load = prefill tokens in flight + this many tokens per in-flight request
    tokens_per_request: int = 256

    # prefill/decode disaggregation: the decode server of a pair (routing.decode_placement). The prefill
    # sends the whole prompt's KV to the decode over a link of kv_transfer_gb_s (1e9 bytes/s; llm-d's
    # typical InfiniBand 20-50 GB/s, RoCEv2 10-25, TCP 1-3: pd-contract.md §3), kv_bytes_per_token each
    # (2 x layers x KV heads x head dim x dtype bytes: Llama-3.1-8B in bf16 is 128 KiB)
    kv_bytes_per_token: int = 131_072
    kv_transfer_gb_s: float = 20.0
    decode_batch_slowdown: float = 0.08  # per sequence decoding beside it: a token's relative slowdown
    decode_reserved_tokens: int = 512  # pre-allocated beside the prompt (SGLang --num-reserved-decode-tokens)
