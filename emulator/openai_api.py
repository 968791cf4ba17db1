"""/v1/chat/completions and /v1/completions handlers (SGLang 0.5.10, contract §2).

A request is parsed into a Job and a Plan (openai_request.py), submitted to the engine, and answered
with a non-stream body (openai_shapes.py) or a stream of chunks (openai_stream.py, written by sse.py):
streams have `usage: null` on ordinary chunks, a separate finish chunk per choice for chat, the finish
reason on the last content chunk for completions, an optional usage chunk, then `[DONE]`. Errors are
SGLang's flat JSON.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from emulator import sse
from emulator.errors import ApiError, flat_error, json_response, read_json
from emulator.fault_hook import request_fault
from emulator.openai_request import Plan, parse_chat, parse_completion
from emulator.openai_shapes import full_body
from emulator.openai_stream import ChunkWriter
from emulator.replica import REPLICA, Job, Replica, Run, debug_headers

Parser = Callable[[dict[str, Any], Replica], tuple[Job, Plan]]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, parse_completion)


async def _handle(request: web.Request, parse: Parser) -> web.StreamResponse:
    replica = request.app[REPLICA]
    try:
        job, plan = parse(await read_json(request), replica)
    except ApiError as err:
        return flat_error(err.status, err.message, err.type)
    fault = await request_fault(replica.armed_faults, job.stream)
    if fault.fail_status is not None:
        return flat_error(fault.fail_status, "Emulated fault.", HTTPStatus(fault.fail_status).phrase)
    async with replica.open(request, job, plan.completions) as run:
        if job.stream:
            events = _events(run, plan, replica.cfg.enable_cache_report)
            return await sse.stream(request, debug_headers(replica), fault.cut_after, events)
        await run.wait()
        if run.failure is not None:
            return flat_error(run.failure.status, run.failure.message, HTTPStatus(run.failure.status).phrase)
        body = full_body(plan, job, run, replica.cfg.enable_cache_report)
        return json_response(body, headers=debug_headers(replica))


async def _events(run: Run, plan: Plan, report: bool) -> AsyncGenerator[bytes, None]:
    writer = ChunkWriter(plan, run, report)
    async for event in run.events():
        for chunk in writer.on_event(event):
            yield orjson.dumps(chunk)
