"""Predicted time to first token, in seconds, term by term.

For a request with P estimated prompt tokens and a candidate whose cache model match is
(G gpu, H host, S storage) tokens, with the replica's learned rates (``routing.rates``):

    uncached  = max(0, P - G - H - S)
    queue_s   = max(inflight_prefill_s + slot_wait, memory_wait)
    slot_wait = when the requests in flight fill max_running_requests (> 0): the k-th smallest
                remaining decode time among the decoding requests, k = inflight - max_running + 1,
                remaining = max(budget, ...) x decode_s_per_token - seconds decoded (budget 0:
                default_new_tokens; a request already past its estimate counts a tenth of it); else 0
    memory_wait = when the KV the requests in flight hold (K, ``kv_tokens``: each one's uncached prompt +
                output budget, a running one's at its replica's ``new_token_ratio``) + this request's
                need (uncached + its budget) exceed the device pool
                (``gpu_tokens``): the smallest remaining decode time by which the decoding requests
                that finish first free the excess; when they cannot, the time by which all of them and
                the queue ahead are done (``inflight_prefill_s``, at least the last decoder's); else 0
    prefill_s = uncached / prefill_rate
    reload_s  = H / host_rate + S / storage_rate
    overhead  = the learned fixed per-request time
    ttft      = queue_s + prefill_s + reload_s + overhead

Every term is in seconds, range [0, inf), O(1) per candidate (slot_wait O(decoding) when the slots are
full). ``inflight_prefill_s`` is the prefill work the proxy has routed to the replica and not seen
finish, in predicted seconds, minus what the head of the queue has already done (``proxy/fleet/load.py``):
requests that are only decoding are not in it, they hold up no prefill. They matter only through what they
hold: past ``max_running_requests`` a new request waits for a decoding one to finish, and so it does when
the device pool is full. SGLang admits a request only once its uncached prompt and its output reservation
fit beside what the running requests hold (SGLang's ``PrefillAdder`` charges the new request its whole
budget and each running one ``new_token_ratio`` x the budget it has left, both clipped at 4096; the emulator
reserves every request's whole output and reports a ratio of 1; the gateway counts a running request's
budget at its replica's scraped ratio, ``proxy/fleet/load.py``). With slow decode (a datacenter profile at
batch 32: ~12 tokens/s per sequence) the pool, not the prefill engine, is what unique prompts wait for: a
replica whose running requests hold long budgets admits nothing for seconds while its prefill queue is empty.
Memory and the prefill queue overlap in time (the queue ahead drains while decoders free memory), so they
combine by max. The cached prefixes that running requests lock are not counted (counting each locked block
once was tried and gained nothing: docs/experiments.md).

The default policy's scorer (``routing.placement``) computes the terms once per candidate and keeps
them in its ``Scored`` entries; the chosen candidate's terms become the request's ``Prediction``.
"""

from __future__ import annotations

from routing.rates import ReplicaRates
from routing.types import Candidate, ReplicaState, RoutingRequest, TtftTerms


def slot_wait_s(state: ReplicaState, decode_s_per_token: float, default_tokens: int) -> float:
    """Expected wait for a running slot (0 while the replica has free slots or an unknown limit)."""
    limit = state.max_running_requests
    if limit <= 0 or state.inflight_requests < limit:
        return 0.0
    need = state.inflight_requests - limit + 1
    remaining = sorted(_remaining(e, b or default_tokens, decode_s_per_token) for e, b, _ in state.decoding)
    if not remaining:
        return default_tokens * decode_s_per_token
    if need <= len(remaining):
        return remaining[need - 1]
    return remaining[-1] + (need - len(remaining)) * default_tokens * decode_s_per_token / limit


def memory_wait_s(state: ReplicaState, need: float, decode_s_per_token: float, default_tokens: int) -> float:
    """Expected wait for device KV memory (0 while the pool has room or its size is unknown)."""
    excess = state.kv_tokens + need - state.gpu_tokens
    if state.gpu_tokens <= 0 or excess <= 0:
        return 0.0
    freeing = sorted(
        (_remaining(e, b or default_tokens, decode_s_per_token), k) for e, b, k in state.decoding
    )
    for remaining, held in freeing:
        excess -= held
        if excess <= 0:
            return remaining
    return max(freeing[-1][0] if freeing else 0.0, state.inflight_prefill_s)


CLIP_OUTPUT_TOKENS = 4096  # SGLang's scheduler clips an output budget at this in its memory estimate


def kv_need(req: RoutingRequest, uncached: float, default_tokens: int) -> float:
    """The KV a request holds while in flight: its uncached prompt + its output budget (clipped as
    SGLang's scheduler clips it, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``)."""
    return uncached + min(req.max_new_tokens or default_tokens, CLIP_OUTPUT_TOKENS)


def _remaining(elapsed: float, budget: int, decode_s_per_token: float) -> float:
    expected = budget * decode_s_per_token
    return max(expected - elapsed, 0.1 * expected)


def predict_ttft(req: RoutingRequest, cand: Candidate, rates: ReplicaRates, default_tokens: int) -> TtftTerms:
    """The predicted TTFT of ``req`` on ``cand``, term by term (module docstring)."""
    m, st = cand.match, cand.state
    uncached = max(0.0, req.prompt_tokens - m.gpu_tokens - m.host_tokens - m.storage_tokens)
    queue = st.inflight_prefill_s
    if st.max_running_requests > 0 and st.inflight_requests >= st.max_running_requests:
        queue += slot_wait_s(st, rates.decode_s_per_token, default_tokens)
    if st.kv_tokens:
        need = kv_need(req, uncached, default_tokens)
        queue = max(queue, memory_wait_s(st, need, rates.decode_s_per_token, default_tokens))
    reload = m.host_tokens / rates.host_tokens_per_s if m.host_tokens else 0.0
    if m.storage_tokens:
        reload += m.storage_tokens / rates.storage_tokens_per_s
    return TtftTerms(queue, uncached / rates.prefill_tokens_per_s, reload, rates.overhead_s, uncached)
