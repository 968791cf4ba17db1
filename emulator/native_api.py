"""SGLang's native generation and tokenizer routes: /generate, /tokenize, /detokenize (contract §1.2).

/generate takes `text` or `input_ids`, `sampling_params` (`max_new_tokens`, 0 allowed = prefill-only
warm-up; `stop`, `n`, `sampling_seed`), `stream`, `rid`, `extra_key`, `return_logprob`. The response is
`{"text", "output_ids", "meta_info"}` (a list when n > 1); `meta_info` always has `cached_tokens`, and
`cached_tokens_details {device, host[, storage, storage_backend]}` when it is > 0. Streams send the
cumulative text and output_ids in every event, then `[DONE]`. Errors are `{"error": {"message"}}`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from emulator import sse
from emulator.errors import ApiError, check_context, is_token_list, json_response, native_error, read_json
from emulator.fault_hook import request_fault
from emulator.replica import REPLICA, WEIGHT_VERSION, Job, Replica, Run, debug_headers, new_rid
from emulator.sampler import Completion, Sampling, verify_sampling
from emulator.structured_output import generate_grammar


def parse_generate(body: dict[str, Any], replica: Replica) -> Job:
    prompt = _prompt(body, replica)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ApiError("sampling_params must be a dict (batched requests are not emulated)")
    temperature, top_p = params.get("temperature", 1.0), params.get("top_p", 1.0)
    if _is_number(temperature) and _is_number(top_p):  # SamplingParams.verify, raw values as sent
        verify_sampling(temperature, top_p)
    max_new = params.get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0):
        raise ApiError(f"max_new_tokens must be at least 0, got {max_new}.")
    stop = params.get("stop") or ()
    stops = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
    n = params.get("n", 1)
    if not isinstance(n, int) or n < 1:
        raise ApiError("n must be at least 1")
    seed = params.get("sampling_seed")
    seed = seed if isinstance(seed, int) else None
    sampling = Sampling(max_new=max_new, stop=stops, n=n, seed=seed, grammar=generate_grammar(params))
    check_context(len(prompt), max_new, replica.cfg.context_length, replica.cfg.max_req_input_len)
    extra_key = body.get("extra_key")
    if extra_key is not None and not isinstance(extra_key, str):
        raise ApiError("extra_key must be a string")
    rid = body.get("rid") if isinstance(body.get("rid"), str) else new_rid()
    return Job(prompt, sampling, extra_key, str(rid), bool(body.get("stream")))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _prompt(body: dict[str, Any], replica: Replica) -> tuple[int, ...]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError("Either text or input_ids should be provided.")
    if isinstance(text, str):
        return tuple(replica.tokenizer.encode(text))
    if isinstance(ids, list) and is_token_list(ids):
        return tuple(ids)
    raise ApiError("text must be a string and input_ids a list of ints (batched requests are not emulated)")


def finish_reason(comp: Completion, count: int) -> dict[str, Any] | None:
    if count < len(comp.ids):
        return None
    if comp.finish == "length":
        return {"type": "length", "length": len(comp.ids)}
    return {"type": "stop", "matched": comp.matched}


def result(job: Job, run: Run, comp: Completion, count: int, index: int | None) -> dict[str, Any]:
    finish = finish_reason(comp, count)
    cached = run.cached_tokens
    meta: dict[str, Any] = {
        "id": job.rid,
        "finish_reason": finish,
        "prompt_tokens": len(job.prompt),
        "weight_version": WEIGHT_VERSION,
        "total_retractions": 0,
        "completion_tokens": count,
        "reasoning_tokens": 0,
        "cached_tokens": cached,
    }
    if cached > 0:
        meta["cached_tokens_details"] = run.cached_details()
    if finish is not None:
        meta["e2e_latency"] = run.elapsed()
    out: dict[str, Any] = {
        "text": comp.text_upto(count),
        "output_ids": list(comp.ids[:count]),
        "meta_info": meta,
    }
    if index is not None:
        out["index"] = index
    return out


async def generate(request: web.Request) -> web.StreamResponse:
    replica = request.app[REPLICA]
    try:
        job = parse_generate(await read_json(request, require_json_type=False), replica)
        comps = tuple(replica.sampler.sample(job.prompt, job.sampling, i) for i in range(job.sampling.n))
    except ApiError as err:
        return native_error(err.status, err.message)
    fault = await request_fault(replica.armed_faults, job.stream)
    if fault.fail_status is not None:
        return native_error(fault.fail_status, f"Emulated fault: {HTTPStatus(fault.fail_status).phrase}.")
    async with replica.open(request, job, comps) as run:
        if job.stream:
            events = _events(job, run, comps)
            return await sse.stream(request, debug_headers(replica), fault.cut_after, events)
        await run.wait()
        if run.failure is not None:
            return native_error(run.failure.status, run.failure.message)
        many = len(comps) > 1
        outs = [result(job, run, c, len(c.ids), i if many else None) for i, c in enumerate(comps)]
        return json_response(outs if many else outs[0], headers=debug_headers(replica))


async def _events(job: Job, run: Run, comps: tuple[Completion, ...]) -> AsyncGenerator[bytes, None]:
    """One cumulative result per choice whenever it has new tokens (the first once it has any, or at once
    when it ends with none); an engine failure is one error event."""
    sent = [-1] * len(comps)
    many = len(comps) > 1
    async for _event in run.events():
        if run.failure is not None:
            yield orjson.dumps({"error": {"message": run.failure.message}})
            return
        for i, count in enumerate(run.counts):
            if count > sent[i] and (count > 0 or count >= len(comps[i].ids)):
                sent[i] = count
                yield orjson.dumps(result(job, run, comps[i], count, i if many else None))


async def tokenize(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    try:
        body = await read_json(request, require_json_type=False)
    except ApiError as err:
        return native_error(err.status, err.message)
    prompt = body.get("prompt", body.get("text", ""))
    if not isinstance(prompt, str):
        return native_error(400, "prompt must be a string")
    tokens = replica.tokenizer.encode(prompt)
    body_out = {"tokens": tokens, "count": len(tokens), "max_model_len": replica.cfg.context_length}
    return json_response(body_out)


async def detokenize(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    try:
        body = await read_json(request, require_json_type=False)
    except ApiError as err:
        return native_error(err.status, err.message)
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return native_error(400, "tokens must be a list of ints")
    return json_response({"text": replica.tokenizer.decode(tokens)})
