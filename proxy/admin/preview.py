"""The route preview: where this gateway would send a request now, and why; nothing is forwarded or
recorded (``Router.preview``).

    POST /admin/route/v1/chat/completions   {chat body}        → 200 {preview}
    POST /admin/route/v1/completions        {completions body}
    POST /admin/route/generate              {SGLang /generate body}

The body is parsed, its model resolved, its session key read (``--session-header``, ``--session-field``)
and its prompt tokenized (``--tokenizer-path``) exactly as the real route does, so a preview answers for
the request as sent. The answer: ``replica``, ``reason``, ``ranked`` (the retry order), ``cost`` (the
policy's score), and ``predicted``: ``ttft_s`` and its terms in seconds (``queue_s``, ``prefill_s``,
``reload_s``, ``overhead_s``), ``prompt_tokens`` (the estimate), ``cached_tokens`` per tier (``gpu``,
``host``, ``storage``: the cache model's match on that replica). Behind the admin key
(``proxy/admin/replicas.py``), like every admin endpoint: a preview shows the fleet's cache map.

Uses: an operator asking "why would this go there?", and ``bench.gateways`` asking every gateway of a
fleet the same question at the same moment (do they share one view?).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import NoReplicaAvailable, NotFound
from proxy.front.handlers import read_body
from proxy.front.openai import parse_request
from proxy.tenancy.admin_key import authorize
from proxy.types import ParsedRequest, Route
from routing.ledger import Preview
from routing.pipeline import NoCandidates
from routing.types import TtftTerms

ROUTES = {"v1/chat/completions": Route.CHAT, "v1/completions": Route.COMPLETIONS, "generate": Route.GENERATE}


async def preview_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    authorize(request, gw.settings)
    route = ROUTES.get(request.match_info["path"].strip("/"))
    if route is None:
        known = ", ".join(f"/admin/route/{p}" for p in ROUTES)
        raise NotFound(f"no route preview for {request.path!r}; known: {known}")
    raw = await read_body(request, gw.settings.max_body_bytes)
    st = gw.settings
    parsed = gw.resolve_model(
        parse_request(route, raw, request.headers.get(st.session_header), st.session_field)
    )
    body = orjson.dumps(_doc(_preview(gw, await gw.exact(parsed))))
    return web.Response(body=body, content_type="application/json")


def _preview(gw: Gateway, parsed: ParsedRequest) -> Preview:
    try:
        return gw.router.preview(parsed.routing, gw.fleet.snapshot(parsed.model))
    except NoCandidates:
        raise NoReplicaAvailable("no healthy replica serves this request's model") from None


def _doc(p: Preview) -> dict[str, Any]:
    d, m = p.decision, p.match
    return {
        "replica": d.replica,
        "reason": d.reason.value,
        "ranked": list(d.ranked),
        "cost": d.cost,
        "predicted": {
            **_terms(p.terms),
            "prompt_tokens": p.prompt_tokens,
            "cached_tokens": {"gpu": m.gpu_tokens, "host": m.host_tokens, "storage": m.storage_tokens},
        },
    }


def _terms(t: TtftTerms | None) -> dict[str, float | None]:
    """The TTFT terms in seconds (only ``ttft_s: null`` for a policy that predicts no time)."""
    if t is None:
        return {"ttft_s": None}
    return {"ttft_s": t.total, "queue_s": t.queue_s, "prefill_s": t.prefill_s, "reload_s": t.reload_s,
            "overhead_s": t.overhead_s}  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_post("/admin/route/{path:.*}", preview_route)
