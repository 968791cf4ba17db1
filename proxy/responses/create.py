"""``POST /v1/responses``: one turn, its chain expanded by the gateway, routed like chat, relayed, stored.

The data flow of a chat request (``proxy/front/handlers.py``), around the state the gateway owns:

1. parse and check the body (``proxy/responses/request.py``); the caller is the owner
   (``proxy/responses/state.py``);
2. the history: the chain ending with ``previous_response_id`` (each response's input items, then its
   output items, oldest first), or the ``conversation``'s items; 404 for one the owner does not have;
3. mint the id (``resp_`` + 32 hex), build the body the replica gets (the history, then this input;
   ``store: false``; ``request_id`` = the id) and what routing gets (a chat prompt);
4. as for chat: input limits, the model resolved, the tenant's namespace and rate limits (``admit``),
   exact mode's token ids, the response cache (which never stores a Responses answer: ``bypass``);
5. a stored (``store``, the default) stream or background turn is recorded ``in_progress`` (``queued``)
   from now on, so GET and cancel find it mid-flight; a whole answer is stored when it completes, as
   SGLang does (``proxy/responses/turn.py``; a store that fails is logged: the turn goes on, unstored);
6. ``forward``: attempts, retries and the relay as for chat; the stream's events and the whole body are
   patched back to what the client asked (``proxy/responses/echo.py``), and the final response is stored
   (and a conversation's new items linked) before the client sees its end. A replica's error answer
   passes as it is and removes the record; a stream cut before its end marks it ``failed``.

``background: true`` (with ``store``) is the gateway's: the answer is the ``queued`` response at once, the
turn runs in a task of this gateway (``in_progress``, then its final status; ``failed`` with a
``server_error`` when no replica answered), GET polls it and cancel stops it (the task is cancelled and
the replica aborts the id). The task counts as a request in progress until it ends: ``max_inflight``
bounds them and a drain waits for them. With ``stream: true`` too, the stream is relayed as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import orjson
from aiohttp import web

from proxy.answers.cache import RESPONSE_CACHE
from proxy.context import GATEWAY, Gateway
from proxy.dispatch.forward import forward
from proxy.errors import GatewayError, MethodNotAllowed
from proxy.front.handlers import read_body
from proxy.front.input_limits import check_limits
from proxy.observe.access_log import access_of
from proxy.responses.chat_view import chat_body
from proxy.responses.echo import EchoTap
from proxy.responses.request import CreateRequest, parse_create, parsed_request, upstream_body
from proxy.responses.state import RESPONSES, Conversation, ResponsesState, conversation_not_found, owner_of
from proxy.responses.turn import Turn, new_turn
from proxy.tenancy.namespace import Charge, admit
from proxy.types import JSONObject, ParsedRequest
from routing.ledger import Ticket

log = logging.getLogger("kvroute.responses")


async def _history(
    state: ResponsesState, owner: str, req: CreateRequest
) -> tuple[list[Any], list[str], Conversation | None]:
    """The items before this turn's input, the chain's ids, the conversation (module docstring, 2)."""
    if req.previous_response_id is not None:
        chain = await state.chain(owner, req.previous_response_id)
        return [item for r in chain for item in r.items], [r.id for r in chain], None
    if req.conversation is not None:
        conv = await state.conversation(owner, req.conversation)
        if conv is None:
            raise conversation_not_found(req.conversation)
        return list(conv.items), [], conv
    return [], [], None


def _routed(request: web.Request, gw: Gateway, body: JSONObject, size: int) -> tuple[ParsedRequest, bytes]:
    """Routing's request for the body a replica gets (its model resolved, its limits checked), and the
    body's bytes."""
    st = gw.settings
    session = request.headers.get(st.session_header)
    parsed = gw.resolve_model(parsed_request(body, size, session, st.session_field))
    body["model"] = parsed.model
    parsed, raw = dataclasses.replace(parsed, body=body), orjson.dumps(body)
    check_limits(parsed, raw, st)
    return parsed, raw


async def _exact(gw: Gateway, parsed: ParsedRequest) -> ParsedRequest:
    """Exact mode's token ids, from the chat view of the request."""
    if gw.tokenizer is None:
        return parsed
    view = dataclasses.replace(parsed, body=chat_body(parsed.body["input"], parsed.body))
    return dataclasses.replace(await gw.exact(view), body=parsed.body)


async def _start(gw: Gateway, turn: Turn, parsed: ParsedRequest) -> tuple[ParsedRequest, Ticket]:
    """Exact mode, the record begun, then the route (the ticket is sent, or nothing is recorded)."""
    parsed = await _exact(gw, parsed)
    await turn.begin()
    try:
        return parsed, gw.route(parsed)
    except BaseException:
        await turn.discard()
        raise


async def create(request: web.Request) -> web.StreamResponse:
    access_of(request)
    if request.method != "POST":
        raise MethodNotAllowed(request.method, ("POST",))
    gw, state = request.app[GATEWAY], request.app[RESPONSES]
    raw = await read_body(request, gw.settings.max_body_bytes)
    req, owner = parse_create(raw), owner_of(request)
    history, chain, conv = await _history(state, owner, req)
    turn = new_turn(state, owner, req, chain, conv.id if conv is not None else None)
    rid = turn.record.id
    parsed, body = _routed(request, gw, upstream_body(req, history, rid, req.model), len(raw))
    parsed, body, charge = await admit(request, gw.limiter, parsed, body)
    queued = turn.record.status == "queued"
    if queued:  # in progress until its task ends: max_inflight bounds background turns, a drain waits
        gw.admission.enter()
    try:
        parsed, ticket = await _start(gw, turn, parsed)
    except BaseException:
        if queued:
            gw.admission.leave()
        _settle(request, charge)
        raise
    if queued:
        task = asyncio.get_running_loop().create_task(
            _background(request, gw, turn, parsed, body, charge, ticket)
        )
        state.tasks[rid] = task
        task.add_done_callback(lambda _: _ended(state, gw, rid))
        return web.Response(body=orjson.dumps(turn.record.response), content_type="application/json")
    try:
        return await _relayed(request, gw, turn, parsed, body, ticket)
    finally:
        _settle(request, charge)


def _ended(state: ResponsesState, gw: Gateway, rid: str) -> None:
    """A background turn's task is over."""
    state.tasks.pop(rid, None)
    gw.admission.leave()


def _settle(request: web.Request, charge: Charge | None) -> None:
    if charge is not None:
        charge.settle(access_of(request))


async def _relayed(
    request: web.Request, gw: Gateway, turn: Turn, parsed: ParsedRequest, body: bytes, ticket: Ticket
) -> web.StreamResponse:
    tap = EchoTap(turn.echo, turn.finish)
    cache = request.app.get(RESPONSE_CACHE)
    try:
        if cache is not None:  # never a Responses answer: counted and marked as a bypass
            resp = await cache.serve(
                request, parsed, lambda _: forward(request, gw, body, parsed, ticket, tap)
            )
        else:
            resp = await forward(request, gw, body, parsed, ticket, tap)
    except asyncio.CancelledError:
        if tap.final is None:
            gw.background.spawn(turn.failed("the client went away before the response was complete"))
        raise
    except BaseException:
        await turn.discard()
        raise
    if not resp.prepared:
        return await _whole(turn, resp)
    if resp.status != 200:
        await turn.discard()
    elif tap.final is None:
        await turn.failed("the stream ended before its terminal event")
    return resp


def _response_of(turn: Turn, resp: web.StreamResponse) -> JSONObject | None:
    """A whole 200 answer's response object, patched; None for anything else."""
    raw = resp.body if isinstance(resp, web.Response) and isinstance(resp.body, bytes) else None
    return turn.echo.body(raw) if resp.status == 200 and raw is not None else None


async def _whole(turn: Turn, resp: web.StreamResponse) -> web.StreamResponse:
    """A whole answer: a response object is patched and stored; anything else passes, unstored."""
    doc = _response_of(turn, resp)
    if doc is None or not isinstance(resp, web.Response):
        await turn.discard()
        return resp
    await turn.finish(doc)
    resp.body = orjson.dumps(doc)
    return resp


async def _background(
    request: web.Request,
    gw: Gateway,
    turn: Turn,
    parsed: ParsedRequest,
    body: bytes,
    charge: Charge | None,
    ticket: Ticket,
) -> None:
    """The background turn: ``forward`` with the creating request's headers (its handler has returned;
    nothing is written to it), then the final response stored."""
    try:
        turn.record.response["status"] = "in_progress"
        await turn.begin()
        resp = await forward(request, gw, body, parsed, ticket)
        doc = _response_of(turn, resp)
        await (turn.finish(doc) if doc is not None else turn.failed(f"the replica answered {resp.status}"))
    except GatewayError as e:
        await turn.failed(e.message)
    except asyncio.CancelledError:
        if turn.state.closing:  # the gateway stops (a cancel has already said "cancelled")
            await turn.failed("the gateway stopped before the response was complete")
        raise
    except Exception:
        log.exception("background response %s failed", turn.record.id)
        await turn.failed("the gateway failed to complete the response")
    finally:
        _settle(request, charge)
