"""The stored responses, served by the gateway to their owner: get, delete, input items, cancel.

    GET    /v1/responses/{id}               the response as the client got it (``queued`` / ``in_progress``
                                            while it runs); query parameters are ignored, as SGLang does
    DELETE /v1/responses/{id}               ``{"id", "object": "response.deleted", "deleted": true}``; a chain
                                            through it can no longer be continued (404 naming it)
    GET    /v1/responses/{id}/input_items   this response's own input items (not its chain's), a list page
                                            (``after``, ``limit``, ``order``: ``proxy/responses/items.py``)
    POST   /v1/responses/{id}/cancel        in flight (queued or in progress, in this gateway or another):
                                            marked ``cancelled``, its background task in this gateway
                                            cancelled and ``POST /abort_request {"rid": id}`` sent to every
                                            replica (the gateway that relays it may be another one, so the
                                            replica is not known here); a finished response is returned as
                                            it is, as SGLang does

An id the caller does not own is the same 404 as an unknown one (``proxy/responses/state.py``).
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from proxy.context import GATEWAY
from proxy.errors import InvalidRequest
from proxy.responses.items import listed, page
from proxy.responses.state import RESPONSES, Record, not_found, owner_of
from proxy.types import JSONObject


def json_answer(doc: JSONObject) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _id(request: web.Request) -> str:
    response_id = request.match_info["response_id"]
    if not response_id.startswith("resp_"):
        raise InvalidRequest(
            f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp_'.",
            param="response_id",
        )
    return response_id


async def _record(request: web.Request) -> Record:
    response_id = _id(request)
    record = await request.app[RESPONSES].get(owner_of(request), response_id)
    if record is None:
        raise not_found(response_id)
    return record


async def retrieve(request: web.Request) -> web.Response:
    return json_answer((await _record(request)).response)


async def delete(request: web.Request) -> web.Response:
    response_id = _id(request)
    if not await request.app[RESPONSES].delete(owner_of(request), response_id):
        raise not_found(response_id)
    return json_answer({"id": response_id, "object": "response.deleted", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    record = await _record(request)
    items = [listed(item, record.id, n) for n, item in enumerate(record.input)]
    return json_answer(page(items, request.query))


async def cancel(request: web.Request) -> web.Response:
    record = await _record(request)
    if record.done:
        return json_answer(record.response)
    state, gw = request.app[RESPONSES], request.app[GATEWAY]
    record.response["status"] = "cancelled"
    await state.put(owner_of(request), record)
    task = state.tasks.get(record.id)
    if task is not None:
        task.cancel()
    await asyncio.gather(*(gw.up.abort(r.id, record.id) for r in gw.fleet.replicas()))
    return json_answer(record.response)
