"""/v1/chat/completions and /v1/completions handlers (SGLang 0.5.10, contract §2).

A request is parsed into one Job per prompt and a Plan (openai_request.py); each Job is submitted to the
engine as its own run (a completions batch runs its prompts side by side) and the request is answered
with a non-stream body (openai_shapes.py) or a stream of chunks merged from its runs (openai_stream.py,
written by sse.py): streams have `usage: null` on ordinary chunks, a separate finish chunk per choice for
chat, the finish reason on the last content chunk for completions, an optional usage chunk once every
run finished, then `[DONE]`. Errors are SGLang's flat JSON; a failed run fails the whole request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from emulator import sse
from emulator.errors import ApiError, flat_error, json_response, read_json
from emulator.fault_hook import request_fault
from emulator.openai_request import Parsed, Plan, parse_chat, parse_completion
from emulator.openai_shapes import full_body
from emulator.openai_stream import ChunkWriter
from emulator.replica import REPLICA, Job, Replica, Run, debug_headers, merged_events
from emulator.tickets import Failed

Parser = Callable[[dict[str, Any], Replica], Parsed]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, parse_completion)


async def _handle(request: web.Request, parse: Parser) -> web.StreamResponse:
    replica = request.app[REPLICA]
    try:
        jobs, plan = parse(await read_json(request), replica)
    except ApiError as err:
        return flat_error(err.status, err.message, err.type)
    streaming = jobs[0].stream
    fault = await request_fault(replica.armed_faults, streaming)
    if fault.fail_status is not None:
        return flat_error(fault.fail_status, "Emulated fault.", HTTPStatus(fault.fail_status).phrase)
    async with contextlib.AsyncExitStack() as stack:
        runs = [
            await stack.enter_async_context(_open(request, replica, plan, jobs, k)) for k in range(len(jobs))
        ]
        if streaming:
            events = _events(plan, jobs, runs, replica.cfg.enable_cache_report)
            return await sse.stream(request, debug_headers(replica), fault.cut_after, events)
        await asyncio.gather(*(run.wait() for run in runs))
        failure = next((run.failure for run in runs if run.failure is not None), None)
        if failure is not None:
            return flat_error(failure.status, failure.message, HTTPStatus(failure.status).phrase)
        body = full_body(plan, jobs, runs, replica.cfg.enable_cache_report)
        return json_response(body, headers=debug_headers(replica))


def _open(request: web.Request, replica: Replica, plan: Plan, jobs: tuple[Job, ...], k: int) -> Run:
    """Submit prompt k of the request with its n choices."""
    n = plan.n
    return replica.open(request, jobs[k], plan.completions[k * n : (k + 1) * n])


async def _events(
    plan: Plan, jobs: tuple[Job, ...], runs: list[Run], report: bool
) -> AsyncGenerator[bytes, None]:
    writer = ChunkWriter(plan, jobs, runs, report)
    async for k, event in merged_events(runs):
        for chunk in writer.on_event(k, event):
            yield orjson.dumps(chunk)
        if isinstance(event, Failed):
            return
