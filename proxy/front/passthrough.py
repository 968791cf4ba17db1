"""The pass-through: the few other ``/v1`` paths of SGLang that kvroute forwards, each named with why.

Only the paths below reach a replica through the pass-through; any other ``/v1/...`` path is a 404
``not_found`` (a method a path does not take, a 405). Each is a read-only computation on the request's
own input, routed by the same policy (by size, and by its ``model``) and admitted like a generation:
client key, rate limits, admission, drain and the body limits of ``proxy/front/input_limits.py``. Replica
control endpoints (``/flush_cache``, ``/abort_request``, weight updates, profiling, LoRA loading, ...)
are never forwarded: the admin API runs them (``proxy/admin/control.py``).

No path here takes SGLang's ``cache_salt`` or ``extra_key`` (sglang ``protocol.py``: ``EmbeddingRequest``,
``ClassifyRequest``, ``ScoringRequest``, ``V1RerankReqInput``, ``TokenizeRequest``,
``DetokenizeRequest``), so a tenant's salt cannot be applied to them: their prompts share a replica's
prefix cache across tenants, as docs/security.md says. Generation only goes through the typed routes,
where the salt is always applied.
"""

from __future__ import annotations

from aiohttp import web

from proxy.context import GATEWAY
from proxy.dispatch.forward import forward
from proxy.errors import InvalidRequest, MethodNotAllowed, NotFound
from proxy.front.handlers import read_body
from proxy.front.input_limits import check_limits
from proxy.front.openai import passthrough_request
from proxy.observe.access_log import access_of
from proxy.tenancy.namespace import admit

ALLOWED: dict[str, str] = {  # path -> why it may pass (all POST, JSON bodies)
    "/v1/embeddings": "OpenAI embeddings (an embedding model's pooled output)",
    "/v1/classify": "classification scores of an input (a classifier model)",
    "/v1/score": "probabilities of label tokens after a query (no text generated)",
    "/v1/rerank": "relevance scores of documents for a query (a reranker model)",
    "/v1/tokenize": "the model's token ids of a prompt or messages",
    "/v1/detokenize": "the text of token ids",
}
METHODS = ("POST",)


def _check(request: web.Request) -> None:
    if request.path not in ALLOWED:
        names = ", ".join(ALLOWED)
        raise NotFound(f"kvroute does not serve {request.path} (it forwards only {names})")
    if request.method not in METHODS:
        raise MethodNotAllowed(request.method, METHODS)


async def passthrough(request: web.Request) -> web.StreamResponse:
    _check(request)
    gw = request.app[GATEWAY]
    raw = await read_body(request, gw.settings.max_body_bytes)
    st = gw.settings
    parsed = passthrough_request(raw, request.path, request.headers.get(st.session_header), st.session_field)
    if not parsed.body:
        raise InvalidRequest(f"{request.path} takes a JSON object body")
    check_limits(parsed, raw, st)
    parsed, raw, charge = await admit(request, gw.limiter, gw.resolve_model(parsed), raw)
    try:
        return await forward(request, gw, raw, parsed, gw.route(parsed))
    finally:
        if charge is not None:
            charge.settle(access_of(request))
