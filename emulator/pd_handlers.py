"""The generation routes of a PD server: chat, completions and /generate with SGLang's PD behaviour.

They parse as the ordinary routes do (openai_request.py, native_api.py), read the bootstrap fields
(pd_request.py) and open their runs through the replica's PdRole (pd_runs.py); the answers have the
ordinary shapes (openai_shapes.py, openai_stream.py, native_api.result), except that

- a prefill answers with one generated token per choice, as SGLang's prefill server does (it forces
  max_new_tokens=1): `finish_reason` "length" (/generate: `{"type": "length", "length": 0}`, SGLang's
  FINISH_LENGTH(length=0)), `completion_tokens` 1, its own cached_tokens, no tool call parsed; that token
  is the decode's first, since both sample the same request with the same seed;
- what SGLang aborts has its PD error shapes (pd_request.py); a stream's headers go out at once and a
  failure is one in-band event before `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from emulator import sse
from emulator.errors import ApiError, flat_error, json_response, native_error, read_json
from emulator.fault_hook import request_fault
from emulator.native_api import parse_generate, result
from emulator.openai_request import Parsed, Plan, parse_chat, parse_completion
from emulator.openai_shapes import full_body
from emulator.openai_stream import ChunkWriter
from emulator.pd_request import (
    Bootstrap,
    PdError,
    native_error_event,
    native_error_response,
    openai_error,
    openai_error_event,
    parse_bootstrap,
)
from emulator.pd_runs import PD_ROLE, PdRole
from emulator.replica import REPLICA, Job, Replica, Run, debug_headers, merged_events
from emulator.sampler import Completion
from emulator.tickets import Failed

Parser = Callable[[dict[str, Any], Replica], Parsed]


def first_token(comp: Completion) -> Completion:
    """The prefill's answer: the first token of the choice, cut by length."""
    return Completion(
        comp.ids[:1], comp.pieces[:1], comp.text_upto(1), "length", None, comp.logprobs[:1], comp.top[:1]
    )


# ---- /v1/chat/completions, /v1/completions -------------------------------------------------------
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, parse_chat, "ChatCompletionRequest")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, parse_completion, "CompletionRequest")


async def _openai(request: web.Request, parse: Parser, model: str) -> web.StreamResponse:
    replica, role = request.app[REPLICA], request.app[PD_ROLE]
    try:
        body = await read_json(request)
        jobs, plan = parse(body, replica)
        boots = parse_bootstrap(body, len(jobs), role.cfg.bootstrap_port, model)
    except ApiError as err:
        return flat_error(err.status, err.message, err.type)
    if role.prefill:
        comps = tuple(first_token(c) for c in plan.completions)
        plan = dataclasses.replace(plan, completions=comps, tool_calls=(None,) * len(comps))
    choices = [plan.completions[k * plan.n : (k + 1) * plan.n] for k in range(len(jobs))]
    fault = await request_fault(replica.armed_faults, jobs[0].stream)
    if fault.fail_status is not None:
        return flat_error(fault.fail_status, "Emulated fault.", HTTPStatus(fault.fail_status).phrase)
    if jobs[0].stream:
        events = _openai_events(request, role, plan, jobs, choices, boots)
        return await sse.stream(request, debug_headers(replica), fault.cut_after, events)
    async with contextlib.AsyncExitStack() as stack:
        try:
            runs = await role.open_runs(stack, request, jobs, choices, boots)
        except PdError as err:
            return openai_error(err)
        await asyncio.gather(*(run.wait() for run in runs))
        failure = next((run.failure for run in runs if run.failure is not None), None)
        if failure is not None:
            return openai_error(PdError(failure.message, failure.status))
        body = full_body(plan, jobs, runs, replica.cfg.enable_cache_report)
        return json_response(body, headers=debug_headers(replica))


async def _openai_events(
    request: web.Request,
    role: PdRole,
    plan: Plan,
    jobs: tuple[Job, ...],
    choices: list[tuple[Completion, ...]],
    boots: tuple[Bootstrap, ...],
) -> AsyncGenerator[bytes, None]:
    async with contextlib.AsyncExitStack() as stack:
        try:
            runs = await role.open_runs(stack, request, jobs, choices, boots)
        except PdError as err:
            yield orjson.dumps(openai_error_event(err.message, err.status))
            return
        writer = ChunkWriter(plan, jobs, runs, role.replica.cfg.enable_cache_report)
        async for k, event in merged_events(runs):
            if isinstance(event, Failed):
                yield orjson.dumps(openai_error_event(event.message, event.status))
                return
            for chunk in writer.on_event(k, event):
                yield orjson.dumps(chunk)


# ---- /generate -----------------------------------------------------------------------------------
async def generate(request: web.Request) -> web.StreamResponse:
    replica, role = request.app[REPLICA], request.app[PD_ROLE]
    try:
        body = await read_json(request, require_json_type=False)
        job = parse_generate(body, replica)
        boots = parse_bootstrap(body, 1, role.cfg.bootstrap_port, "GenerateReqInput")
        comps = tuple(_sample(replica, role, job, i) for i in range(job.sampling.n))
    except ApiError as err:
        return native_error(err.status, err.message)
    fault = await request_fault(replica.armed_faults, job.stream)
    if fault.fail_status is not None:
        return native_error(fault.fail_status, f"Emulated fault: {HTTPStatus(fault.fail_status).phrase}.")
    if job.stream:
        events = _native_events(request, role, job, comps, boots)
        return await sse.stream(request, debug_headers(replica), fault.cut_after, events)
    async with contextlib.AsyncExitStack() as stack:
        try:
            (run,) = await role.open_runs(stack, request, (job,), (comps,), boots)
        except PdError as err:
            return native_error_response(err)
        await run.wait()
        if run.failure is not None:
            return native_error_response(PdError(run.failure.message, run.failure.status))
        many = len(comps) > 1
        outs = [_result(role, job, run, c, len(c.ids), i if many else None) for i, c in enumerate(comps)]
        return json_response(outs if many else outs[0], headers=debug_headers(replica))


def _sample(replica: Replica, role: PdRole, job: Job, i: int) -> Completion:
    """Choice i; a prefill's is its first token (drawn with max_new_tokens 1 when the request allows 0)."""
    comp = replica.sampler.sample(job.prompt, job.sampling, i)
    if not role.prefill:
        return comp
    if not comp.ids:
        comp = replica.sampler.sample(job.prompt, dataclasses.replace(job.sampling, max_new=1), i)
    return first_token(comp)


def _result(
    role: PdRole, job: Job, run: Run, comp: Completion, count: int, index: int | None
) -> dict[str, Any]:
    out = result(job, run, comp, count, index)
    meta = out["meta_info"]
    if role.prefill and meta["finish_reason"] is not None:
        meta["finish_reason"] = {"type": "length", "length": 0}
    return out


async def _native_events(
    request: web.Request, role: PdRole, job: Job, comps: tuple[Completion, ...], boots: tuple[Bootstrap, ...]
) -> AsyncGenerator[bytes, None]:
    """As native_api's stream: one cumulative result per choice whenever it has new tokens."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            (run,) = await role.open_runs(stack, request, (job,), (comps,), boots)
        except PdError as err:
            yield orjson.dumps(native_error_event(err.message))
            return
        sent, many = [-1] * len(comps), len(comps) > 1
        async for _event in run.events():
            if run.failure is not None:
                yield orjson.dumps(native_error_event(run.failure.message))
                return
            for i, count in enumerate(run.counts):
                if count > sent[i] and (count > 0 or count >= len(comps[i].ids)):
                    sent[i] = count
                    yield orjson.dumps(_result(role, job, run, comps[i], count, i if many else None))
