"""The Responses and Conversations routes on a gateway app, and the lifetime of their state store.

``add_routes(app)`` (``proxy/server.py``, before the ``/v1`` pass-through) makes the state
(``proxy/responses/state.py``: Redis with ``--state redis://...``, else this process) and registers:

    /v1/responses                         POST   create (``proxy/responses/create.py``)
    /v1/responses/{id}                    GET, DELETE
    /v1/responses/{id}/input_items        GET
    /v1/responses/{id}/cancel             POST   (``proxy/responses/lookup.py``)
    /v1/conversations[/{id}[/items[/{item}]]]    (``proxy/responses/conversations.py``)

Another method is an OpenAI-shaped 405 naming the allowed ones. At shutdown the background responses
still running in this gateway are cancelled (their replicas asked to abort them), then the store closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from proxy.context import GATEWAY
from proxy.errors import MethodNotAllowed
from proxy.responses import conversations, create, lookup
from proxy.responses.state import RESPONSES, make_state

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def by_method(handlers: dict[str, Handler]) -> Handler:
    """One route's handler per method; a 405 for any other."""

    async def handle(request: web.Request) -> web.StreamResponse:
        handler = handlers.get(request.method)
        if handler is None:
            raise MethodNotAllowed(request.method, tuple(handlers))
        return await handler(request)

    return handle


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await app[RESPONSES].close()


def add_routes(app: web.Application) -> None:
    app[RESPONSES] = make_state(app[GATEWAY].settings)
    app.cleanup_ctx.append(_lifetime)
    r = app.router
    r.add_route("*", "/v1/responses", create.create)
    one = by_method({"GET": lookup.retrieve, "DELETE": lookup.delete})
    r.add_route("*", "/v1/responses/{response_id}", one)
    r.add_route("*", "/v1/responses/{response_id}/input_items", by_method({"GET": lookup.input_items}))
    r.add_route("*", "/v1/responses/{response_id}/cancel", by_method({"POST": lookup.cancel}))
    for path, handler in conversations.routes():
        r.add_route("*", path, handler)
