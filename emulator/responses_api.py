"""/v1/responses handlers, as SGLang 0.5.23 serves them (responses-contract §1, checklist §5).

    POST /v1/responses                  create: a response object, a stream (responses_stream.py), or with
                                        `background` a `queued` object at once
    GET  /v1/responses/{id}             the stored object
    POST /v1/responses/{id}/cancel      cancel an in-flight background response
    DELETE, /input_items, /v1/conversations are not served: FastAPI's 405 / 404 (server.py)

A request is checked and planned by responses_request.py, then runs as one engine request through the
replica (`Replica.open`), the same prefix cache, tiers, timing and metrics as chat. Errors are nested
(`{"error": {message, type, param, code}}`, errors.nested_error). Without `--enable-response-store` the
stateful parts are SGLang's 400s; with it the replica keeps responses in memory (response_store.py):
`store: true` (the default) keeps the history when the request starts and the response when it ends;
`background: true` answers `queued`, then generates in a task (`in_progress`, then the final object; a
failure only marks it `failed`); GET or cancel of a non-background response before it ended is a 404.

A non-streamed engine failure is SGLang's: a 400-status abort is a 400 error, any other abort a `failed`
response with `error: {"code": "server_error"}`; the engine's own pre-generation errors (context length,
SamplingParams.verify) are 400s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from http import HTTPStatus
from typing import Any

from aiohttp import web

from emulator import sse
from emulator.errors import ApiError, json_response, nested_error, read_json
from emulator.fault_hook import request_fault
from emulator.openai_shapes import chat_logprobs
from emulator.replica import REPLICA, Replica, Run, debug_headers
from emulator.responses_request import (
    ResponsesCall,
    ResponsesPlan,
    id_errors,
    not_found,
    parse,
    plan,
    request_error,
    store_disabled,
)
from emulator.responses_shapes import (
    CallItem,
    hex_id,
    message_item,
    output_text,
    response_body,
    server_error,
    status_of,
    usage,
)
from emulator.responses_stream import EventWriter


async def create(request: web.Request) -> web.StreamResponse:
    replica = request.app[REPLICA]
    store = replica.responses
    try:
        call = parse(await read_json(request), replica, store)
        planned = plan(call, replica)
    except ApiError as err:
        return nested_error(err)
    fault = await request_fault(replica.armed_faults, call.stream)
    if fault.fail_status is not None:
        phrase = HTTPStatus(fault.fail_status).phrase
        return nested_error(ApiError("Emulated fault.", fault.fail_status, phrase))
    if call.persist:
        store.begin(call.request_id, call.history)
    headers = debug_headers(replica)
    if call.background:
        queued = response_body(call, "queued", [], None)
        store.put(call.request_id, queued)
        store.track(call.request_id, asyncio.create_task(_background(request, replica, call, planned)))
        return json_response(queued, headers=headers)
    if call.stream:
        frames = _frames(request, replica, call, planned)
        return await sse.stream(request, headers, fault.cut_after, frames, framed=True)
    if planned.engine_error is not None:
        return nested_error(request_error(planned.engine_error), headers)
    async with replica.open(request, planned.job, (planned.completion,)) as run:
        await run.wait()
    failure = run.failure
    if failure is not None and failure.status == HTTPStatus.BAD_REQUEST:
        return nested_error(request_error(failure.message), headers)
    response = final_response(call, planned, run)
    if call.persist:
        store.finish(call.request_id, response, call.history)
    return json_response(response, headers=headers)


def final_response(call: ResponsesCall, planned: ResponsesPlan, run: Run) -> dict[str, Any]:
    """The non-streamed response once its run ended (finished, or failed by an abort)."""
    comp = planned.completion
    count = sum(run.counts)
    output: list[dict[str, Any]] = []
    if planned.call is not None and count >= len(comp.ids):
        output.append(CallItem.of(call, planned.call).item())
    elif planned.call is None and (text := comp.text_upto(count)):
        logprobs = chat_logprobs(comp, 0, count)["content"] if call.logprobs else None
        output.append(message_item(hex_id("msg_"), [output_text(text, logprobs)]))
    used = usage(len(planned.job.prompt), count, run.cached_tokens)
    if run.failure is not None:
        return response_body(call, "failed", output, used, server_error(run.failure.message))
    return response_body(call, status_of(comp.finish), output, used)


async def _background(
    request: web.Request, replica: Replica, call: ResponsesCall, planned: ResponsesPlan
) -> None:
    """SGLang's `_run_background_request`: in_progress, generate, store the result (or mark it failed)."""
    store, rid = replica.responses, call.request_id
    store.set_status(rid, "in_progress")
    if planned.engine_error is None:
        async with replica.open(request, planned.job, (planned.completion,)) as run:
            await run.wait()
        if run.failure is None or run.failure.status != HTTPStatus.BAD_REQUEST:
            store.finish(rid, final_response(call, planned, run), call.history)
            return
    stored = store.get(rid)
    if stored is not None and stored["status"] not in ("completed", "cancelled"):
        stored["status"] = "failed"


async def _frames(
    request: web.Request, replica: Replica, call: ResponsesCall, planned: ResponsesPlan
) -> AsyncGenerator[bytes, None]:
    store = replica.responses

    def finalize(response: dict[str, Any]) -> None:
        if call.persist:
            store.finish(call.request_id, response, call.history)

    writer = EventWriter(call, planned, None, finalize)
    for frame in writer.start():
        yield frame
    if planned.engine_error is not None:
        for frame in writer.rejected(planned.engine_error):
            yield frame
        return
    async with replica.open(request, planned.job, (planned.completion,)) as run:
        writer.run = run
        async for event in run.events():
            for frame in writer.on_event(event):
                yield frame


def _stored(replica: Replica, response_id: str) -> dict[str, Any]:
    """The checks of GET and cancel, in SGLang's order: store off, the `resp_` prefix, presence."""
    if not replica.cfg.enable_response_store:
        raise store_disabled("response_id")
    if not response_id.startswith("resp_"):
        raise id_errors(response_id)
    stored = replica.responses.get(response_id)
    if stored is None:
        raise not_found(response_id)
    return stored


async def retrieve(request: web.Request) -> web.Response:
    """Query parameters (stream, include, starting_after) are ignored, as SGLang ignores them."""
    replica = request.app[REPLICA]
    try:
        stored = _stored(replica, request.match_info["response_id"])
    except ApiError as err:
        return nested_error(err)
    return json_response(stored, headers=debug_headers(replica))


async def cancel(request: web.Request) -> web.Response:
    replica = request.app[REPLICA]
    response_id = request.match_info["response_id"]
    try:
        _stored(replica, response_id)
    except ApiError as err:
        return nested_error(err)
    cancelled = await replica.responses.cancel(response_id)
    return json_response(cancelled, headers=debug_headers(replica))


async def cleanup(app: web.Application) -> None:
    """App shutdown: the background generations end (their engine requests are aborted)."""
    tasks = list(app[REPLICA].responses.tasks.values())
    app[REPLICA].responses.clear()
    await asyncio.gather(*tasks, return_exceptions=True)


def register(app: web.Application) -> None:
    """The routes, and the shutdown of background generations."""
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve, allow_head=False)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
    app.on_cleanup.append(cleanup)
