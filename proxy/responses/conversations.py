"""The Conversations API, served by the gateway from its state store, to each conversation's owner.

    POST   /v1/conversations                       ``{items?, metadata?}`` → the conversation: ``{"id":
                                                   "conv_...", "object", "created_at", "metadata"}``
    GET    /v1/conversations/{id}                  the conversation
    POST   /v1/conversations/{id}                  ``{metadata}``: replaced
    DELETE /v1/conversations/{id}                  ``{"id", "object": "conversation.deleted",
                                                   "deleted": true}``
    GET    /v1/conversations/{id}/items            a list page (``after``, ``limit``, ``order``; newest first
                                                   by default, as OpenAI)
    POST   /v1/conversations/{id}/items            ``{items}``: appended; the list of the added items
    GET    /v1/conversations/{id}/items/{item}     one item
    DELETE /v1/conversations/{id}/items/{item}     the item removed; the conversation

Items: at most 20 per call, each an object with a string ``type`` or a ``role`` (a message); kept in the
listed shape (``proxy/responses/items.py``) with a fresh id when they have none. ``metadata``: at most 16
string values, as on a response. ``POST /v1/responses`` with ``conversation`` puts the conversation's items
before its input and appends its input and output items once it has finished. An id the caller does not
own is the same 404 as an unknown one.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from proxy.context import GATEWAY
from proxy.errors import InvalidRequest, MethodNotAllowed, NotFound
from proxy.front.handlers import read_body
from proxy.front.openai import parse_json
from proxy.responses.items import listed, new_id, page, with_id
from proxy.responses.lookup import json_answer
from proxy.responses.request import check_metadata
from proxy.responses.state import RESPONSES, Conversation, conversation_not_found, owner_of
from proxy.types import JSONObject

MAX_ITEMS = 20  # items per create call


async def _body(request: web.Request, required: bool = True) -> JSONObject:
    raw = await read_body(request, request.app[GATEWAY].settings.max_body_bytes)
    return parse_json(raw) if raw or required else {}


def _items(value: object, required: bool) -> list[JSONObject]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value) or len(value) > MAX_ITEMS:
        raise InvalidRequest(f"'items' must be an array of 1 to {MAX_ITEMS} items", param="items")
    for n, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("type", item.get("role")), str):
            raise InvalidRequest(
                f"'items[{n}]' must be an object with a 'type' or a 'role'", param=f"items[{n}]"
            )
        if item.get("type", "message") == "message" and not isinstance(item.get("role"), str):
            raise InvalidRequest(f"'items[{n}]' is a message without a 'role'", param=f"items[{n}]")
    return [listed(with_id(item), "", n) for n, item in enumerate(value)]


async def _conversation(request: web.Request) -> Conversation:
    conversation_id = request.match_info["conversation_id"]
    conv = await request.app[RESPONSES].conversation(owner_of(request), conversation_id)
    if conv is None:
        raise conversation_not_found(conversation_id)
    return conv


async def create(request: web.Request) -> web.Response:
    if request.method != "POST":
        raise MethodNotAllowed(request.method, ("POST",))
    body = await _body(request, required=False)
    check_metadata(body.get("metadata"))
    conv = Conversation(new_id("conv_"), int(time.time()), body.get("metadata") or {})
    conv.items = _items(body.get("items"), required=False)
    await request.app[RESPONSES].put_conversation(owner_of(request), conv)
    return json_answer(conv.public())


async def one(request: web.Request) -> web.Response:
    """GET (the conversation), POST (its metadata replaced), DELETE."""
    state, owner = request.app[RESPONSES], owner_of(request)
    if request.method == "DELETE":
        conversation_id = request.match_info["conversation_id"]
        if not await state.delete_conversation(owner, conversation_id):
            raise conversation_not_found(conversation_id)
        return json_answer({"id": conversation_id, "object": "conversation.deleted", "deleted": True})
    if request.method == "GET":
        return json_answer((await _conversation(request)).public())
    if request.method != "POST":
        raise MethodNotAllowed(request.method, ("GET", "POST", "DELETE"))
    body = await _body(request)
    if not isinstance(body.get("metadata"), dict):
        raise InvalidRequest("'metadata' is required: an object", param="metadata")
    check_metadata(body["metadata"])
    async with state.lock(owner, request.match_info["conversation_id"]):
        conv = await _conversation(request)
        conv.metadata = body["metadata"]
        await state.put_conversation(owner, conv)
    return json_answer(conv.public())


async def items(request: web.Request) -> web.Response:
    """GET (a page of the items), POST (items appended)."""
    if request.method == "GET":
        return json_answer(page((await _conversation(request)).items, request.query))
    if request.method != "POST":
        raise MethodNotAllowed(request.method, ("GET", "POST"))
    added = _items((await _body(request)).get("items"), required=True)
    state, owner = request.app[RESPONSES], owner_of(request)
    async with state.lock(owner, request.match_info["conversation_id"]):
        conv = await _conversation(request)
        conv.items.extend(added)
        await state.put_conversation(owner, conv)
    return json_answer({**page(added, {"order": "asc", "limit": str(MAX_ITEMS)}), "has_more": False})


def _find(conv: Conversation, item_id: str) -> int:
    for n, item in enumerate(conv.items):
        if item.get("id") == item_id:
            return n
    raise NotFound(f"Item with id '{item_id}' not found.", param="item_id")


async def item(request: web.Request) -> web.Response:
    """GET (one item), DELETE (it is removed; the conversation)."""
    item_id = request.match_info["item_id"]
    if request.method == "GET":
        conv = await _conversation(request)
        return json_answer(conv.items[_find(conv, item_id)])
    if request.method != "DELETE":
        raise MethodNotAllowed(request.method, ("GET", "DELETE"))
    state, owner = request.app[RESPONSES], owner_of(request)
    async with state.lock(owner, request.match_info["conversation_id"]):
        conv = await _conversation(request)
        del conv.items[_find(conv, item_id)]
        await state.put_conversation(owner, conv)
    return json_answer(conv.public())


def routes() -> list[tuple[str, Any]]:
    """(path, handler) of the Conversations API."""
    base = "/v1/conversations"
    return [
        (base, create),
        (base + "/{conversation_id}", one),
        (base + "/{conversation_id}/items", items),
        (base + "/{conversation_id}/items/{item_id}", item),
    ]
