"""The documents of a warm-up request: validation, and the prefill-only requests that warm them.

A ``POST /v1/warmup`` body::

    {"model"?: "...", "documents": [{"id"?: "...", "text": "..."} | {"id"?: "...", "messages": [...]}],
     "replicas"?: 1 | "all", "ttl"?: 3600, "wait"?: false, "cache_salt"?: "...", "tenant"?: "..."}

Any other field, in the body or in a document, is a 400 naming it: a field kvroute does not know is
never silently ignored. ``tenant`` is read by ``proxy/warm/access.py`` (only the admin key may name one);
a body without ``model`` is given the fleet's only model before it gets here (``proxy/warm/api.py``).

- ``text``: a plain prompt prefix, as later ``/v1/completions`` or ``/generate`` requests start with it.
  It is warmed with SGLang's cheapest prefill-only request (contract §7): ``POST /generate`` with
  ``sampling_params.max_new_tokens: 0`` (``extra_key`` carries the ``cache_salt``: ``/generate`` has no
  ``cache_salt``, and SGLang's OpenAI routes key a request by ``cache_salt + extra_key``).
- ``messages``: the chat messages later requests start with: a document in the system message, or in
  the user message before the question (the two layouts RAG frameworks use). Only the engine knows its
  chat template, so these are warmed through ``/v1/chat/completions`` with ``max_tokens: 1`` (chat treats
  0 as unset): one decoded token is the price of a prefix rendered exactly as later requests render it.

Both are canonicalised and hashed exactly as live requests are (``proxy.front.openai`` builds the same typed
prompt), so a live request that starts with a warmed prefix matches it in the cache model. A document
warmed for a tenant is put in that tenant's namespace exactly as its live requests are
(``proxy.tenancy.namespace.isolate``: the salt in ``cache_salt`` / ``extra_key``, the tenant in the routing
keys), so it is a hit for that tenant's requests and for no one else's.

**Steps.** A long document is warmed in prefixes of at most ``step_tokens``: each step sends the
document up to a cut and the engine computes only the part beyond the previous cut (the earlier part is
cached), so a live request that arrives during a warm-up waits for one step at most, not for the whole
document. Text is cut at character positions of the estimate; messages cut the last message's string
content. The worker (``proxy/warm/jobs.py``) picks each cut when it sends the step.

Limits (each a 400 naming the field): at most ``MAX_DOCUMENTS`` documents, ``MAX_DOCUMENT_BYTES`` per
document, ids of up to 128 characters, unique in the request. Documents are data, never URLs to fetch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.front.openai import parse_request
from proxy.tenancy.namespace import TENANT_PREFIX, isolate
from proxy.types import JSONObject, ParsedRequest, Route

FIELDS = frozenset({"model", "documents", "replicas", "ttl", "wait", "cache_salt", "tenant"})
DOCUMENT_FIELDS = frozenset({"id", "text", "messages"})
MAX_DOCUMENTS = 1000
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_TTL_S = 7 * 24 * 3600.0
DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True, slots=True)
class Step:
    """One prefill-only request: its path and body, and the typed request routing sees of it."""

    path: str
    body: bytes
    parsed: ParsedRequest


@dataclass(frozen=True, slots=True)
class Document:
    """One document to warm (its text lives here, in memory only, while its ttl lasts)."""

    id: str
    model: str
    text: str | None
    messages: tuple[JSONObject, ...]
    cache_salt: str
    tenant: str = ""  # the namespace it is warmed in ("": no tenant)

    @property
    def kind(self) -> str:
        return "text" if self.text is not None else "messages"

    def size_bytes(self) -> int:
        if self.text is not None:
            return len(self.text.encode())
        return len(orjson.dumps(list(self.messages)))

    def whole(self) -> Step:
        """The one request that warms the whole document."""
        return self.step(self.cut_length())

    def cut_length(self) -> int:
        """The length that steps cut (characters of the text, or of the last message's string content;
        0 when that content is not a string: such a document is warmed in one step)."""
        if self.text is not None:
            return len(self.text)
        content = self.messages[-1].get("content")
        return len(content) if isinstance(content, str) else 0

    def step(self, cut: int, rid: str | None = None) -> Step:
        """The request that sends the document up to ``cut`` (``cut_length()``: all of it), with SGLang's
        request id ``rid`` when given (so that ``/abort_request`` can stop it)."""
        if self.text is not None:
            return self._text_step(self.text[:cut], rid)
        last = self.messages[-1]
        content = last.get("content")
        if not isinstance(content, str):
            return self._chat_step(self.messages, rid)
        return self._chat_step((*self.messages[:-1], {**last, "content": content[:cut]}), rid)

    def _text_step(self, text: str, rid: str | None) -> Step:
        body: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": 0}}
        if self.cache_salt:
            body["extra_key"] = self.cache_salt
        if rid is not None:
            body["rid"] = rid
        raw = orjson.dumps(body)
        parsed = parse_request(Route.GENERATE, raw)
        parsed = dataclasses.replace(parsed, model=self.model, routing=_with_model(parsed, self.model))
        return Step("/generate", *self._isolated(parsed, raw))

    def _chat_step(self, messages: tuple[JSONObject, ...], rid: str | None = None) -> Step:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "max_tokens": 1}
        if self.cache_salt:
            body["cache_salt"] = self.cache_salt
        if rid is not None:
            body["rid"] = rid
        raw = orjson.dumps(body)
        return Step("/v1/chat/completions", *self._isolated(parse_request(Route.CHAT, raw), raw))

    def _isolated(self, parsed: ParsedRequest, raw: bytes) -> tuple[bytes, ParsedRequest]:
        """The step in the document's tenant's namespace, as that tenant's live requests are."""
        parsed, raw = isolate(parsed, raw, self.tenant)
        return raw, parsed


def _with_model(parsed: ParsedRequest, model: str) -> Any:
    return dataclasses.replace(parsed.routing, model=model)


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    model: str
    documents: tuple[Document, ...]
    replicas: int | None  # None = every replica serving the model
    ttl_s: float
    wait: bool


def _known(fields: object, allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed) if isinstance(fields, dict) else []
    if unknown:
        name, known = where + unknown[0], ", ".join(sorted(allowed))
        raise InvalidRequest(f"unknown field '{name}' (known: {known})", param=name)


def parse_warmup(body: JSONObject, tenant: str = "") -> WarmupRequest:
    """Validates a ``POST /v1/warmup`` body, its documents warmed in ``tenant``'s namespace; raises
    InvalidRequest naming the field."""
    _known(body, FIELDS, "")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    salt = body.get("cache_salt", "")
    if not isinstance(salt, str):
        raise InvalidRequest("'cache_salt' must be a string", param="cache_salt")
    if salt.startswith(TENANT_PREFIX):
        raise InvalidRequest(f"'cache_salt' may not start with {TENANT_PREFIX!r}", param="cache_salt")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise InvalidRequest("'documents' must be a non-empty array", param="documents")
    if len(docs) > MAX_DOCUMENTS:
        raise InvalidRequest(
            f"at most {MAX_DOCUMENTS} documents per request, got {len(docs)}", param="documents"
        )
    parsed = tuple(_document(i, d, model, salt, tenant) for i, d in enumerate(docs))
    ids = [d.id for d in parsed]
    if len(set(ids)) != len(ids):
        raise InvalidRequest("document ids must be unique within a request", param="documents")
    return WarmupRequest(
        model, parsed, _replicas(body.get("replicas", 1)), _ttl(body.get("ttl")), _wait(body)
    )


def _document(i: int, d: object, model: str, salt: str, tenant: str) -> Document:
    where = f"documents[{i}]"
    if not isinstance(d, dict):
        raise InvalidRequest(f"'{where}' must be an object with 'text' or 'messages'", param=where)
    _known(d, DOCUMENT_FIELDS, where + ".")
    doc_id = d.get("id", f"doc-{i}")
    if not isinstance(doc_id, str) or not doc_id or len(doc_id) > 128:
        raise InvalidRequest(f"'{where}.id' must be a string of 1-128 characters", param=f"{where}.id")
    text, messages = d.get("text"), d.get("messages")
    if (text is None) == (messages is None):
        raise InvalidRequest(f"'{where}' needs exactly one of 'text' and 'messages'", param=where)
    if text is not None and (not isinstance(text, str) or not text):
        raise InvalidRequest(f"'{where}.text' must be a non-empty string", param=f"{where}.text")
    if messages is not None:
        probe = orjson.dumps({"model": model, "messages": messages})
        parse_request(Route.CHAT, probe)  # the same validation as a live chat request
    doc = Document(doc_id, model, text, tuple(messages or ()), salt, tenant)
    if doc.size_bytes() > MAX_DOCUMENT_BYTES:
        raise InvalidRequest(f"'{where}' exceeds {MAX_DOCUMENT_BYTES} bytes", param=where)
    return doc


def _replicas(value: object) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest("'replicas' must be a positive integer or \"all\"", param="replicas")
    return value


def _ttl(value: object) -> float:
    if value is None:
        return DEFAULT_TTL_S
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TTL_S:
        raise InvalidRequest(f"'ttl' must be seconds in (0, {MAX_TTL_S:.0f}]", param="ttl")
    return float(value)


def _wait(body: JSONObject) -> bool:
    value = body.get("wait", False)
    if not isinstance(value, bool):
        raise InvalidRequest("'wait' must be a boolean", param="wait")
    return value
