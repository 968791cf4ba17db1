"""The oracle: a tiny aiohttp proxy that routes on the emulators' *true* predicted TTFT.

For each generation request (chat, completions, native generate) it:
1. asks every backend `POST /_emu/predict {"path", "body"}` (emulator `--emu-debug`), which returns the
   TTFT the request would get if it arrived now, from the replica's real radix cache (GPU / host /
   storage tokens) and real queue. The prompt is tokenized once, here, with the emulator's own chat
   template and pseudo-tokenizer, and predicted as native `/generate` with `input_ids`: the same
   tokens, but the emulators (all replicas share one process and one core) do not tokenize a long
   prompt N extra times per request, which would stall every replica's timers on that core;
2. adds, per backend, the prefill work of requests it has forwarded there that the backend has not yet
   acknowledged (response headers not yet received), since `predict` cannot see those;
3. forwards to the backend with the lowest total; exact ties rotate (never "the first one");
4. relays the response chunk by chunk (status, content type and `x-emu-replica` kept).

Choosing and booking the pending work happen with no await in between (atomic on the event loop), so
two simultaneous requests do not both take the same idle replica; predictions are fetched without a
lock (a lock would serialise the oracle behind N predictions per request, and its queueing would show
up in every TTFT it reports). It is greedy per request and does not foresee future requests, so it
is a strong reference, not a strict lower bound. It has no health checks and no retries: a replica that
is down (rag_restart's outage) still answers /_emu/predict, looks idle, and a request forwarded to it
answers 500 when its connection is reset.

    python -m bench.systems.oracle --port P --backend URL [--backend URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson
from aiohttp import web

from bench.workloads.tokens import PromptTokenizer, SegmentTokenizer, token_ids
from emulator.errors import ApiError
from emulator.openai_request import extra_key_of

RELAYED_HEADERS = ("content-type", "x-emu-replica", "x-request-id")


class OracleState:
    """Pending (unacknowledged) prefill seconds per backend, a tie rotation, a tokenizer, a decision log."""

    def __init__(self, backends: Sequence[str], decisions: IO[bytes] | None = None) -> None:
        self.decisions = decisions
        self.tokenizer = SegmentTokenizer()
        self.pending = {b: 0.0 for b in backends}
        self.turn = itertools.count()

    def choose(self, predictions: dict[str, dict[str, float]]) -> str:
        totals = {b: p["ttft_s"] + self.pending[b] for b, p in predictions.items()}
        best = min(totals.values())
        ties = [b for b, t in totals.items() if t <= best + 1e-9]
        return ties[next(self.turn) % len(ties)]

    def log(self, chosen: str, predictions: dict[str, dict[str, float]]) -> None:
        """One JSON line per decision (token counts and seconds only, never prompt text)."""
        if self.decisions is not None:
            line = {"t": time.time(), "chosen": chosen, "pending": self.pending, "predictions": predictions}
            self.decisions.write(orjson.dumps(line) + b"\n")


BACKENDS = web.AppKey("backends", list[str])
SESSION = web.AppKey("session", aiohttp.ClientSession)
STATE = web.AppKey("state", OracleState)


def predict_payload(tokenizer: PromptTokenizer, path: str, body: dict[str, Any]) -> bytes:
    """The /_emu/predict body: pre-tokenized native input_ids when possible, else the request as is. A
    cache namespace (`cache_salt` + `extra_key`, which the emulator concatenates) goes as the native
    request's `extra_key`: the same radix root, still without N tokenizations."""
    ids = token_ids(tokenizer, path, body)
    try:
        key = extra_key_of(body)
    except ApiError:
        ids = None
    if ids is None:
        return orjson.dumps({"path": path, "body": body})  # the emulator answers what it makes of it
    native: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    if key is not None:
        native["extra_key"] = key
    return orjson.dumps({"path": "/generate", "body": native})


async def _predict(session: aiohttp.ClientSession, backend: str, payload: bytes) -> dict[str, float]:
    headers = {"content-type": "application/json"}
    async with session.post(backend + "/_emu/predict", data=payload, headers=headers) as resp:
        resp.raise_for_status()
        result: dict[str, float] = orjson.loads(await resp.read())
        return result


async def _decide(app: web.Application, path: str, body: dict[str, Any]) -> tuple[str, float]:
    state, session = app[STATE], app[SESSION]
    payload = predict_payload(state.tokenizer, path, body)
    backends = app[BACKENDS]
    results = await asyncio.gather(*(_predict(session, b, payload) for b in backends))
    predictions = dict(zip(backends, results, strict=True))
    # choose and book with no await in between: atomic on the event loop
    chosen = state.choose(predictions)
    work = max(0.0, predictions[chosen]["ttft_s"] - predictions[chosen].get("queue_s", 0.0))
    state.log(chosen, predictions)
    state.pending[chosen] += work
    return chosen, work


async def generate(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return web.json_response(
            {"error": {"message": "invalid JSON", "type": "invalid_request_error"}}, status=400
        )
    app = request.app
    chosen, work = await _decide(app, request.path, body)
    acknowledged = False
    try:
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        async with app[SESSION].post(chosen + request.path, data=raw, headers=headers) as upstream:
            app[STATE].pending[chosen] -= work
            acknowledged = True
            response = web.StreamResponse(status=upstream.status)
            for name in RELAYED_HEADERS:
                if name in upstream.headers:
                    response.headers[name] = upstream.headers[name]
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    finally:
        if not acknowledged:
            app[STATE].pending[chosen] -= work


async def models(request: web.Request) -> web.Response:
    async with request.app[SESSION].get(request.app[BACKENDS][0] + "/v1/models") as upstream:
        return web.Response(
            body=await upstream.read(), status=upstream.status, content_type="application/json"
        )


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        app[SESSION] = session
        yield


def build_app(backends: Sequence[str], decisions: IO[bytes] | None = None) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    urls = [b.rstrip("/") for b in backends]
    app[BACKENDS] = urls
    app[STATE] = OracleState(urls, decisions)
    app.cleanup_ctx.append(_session_ctx)
    for path in ("/v1/chat/completions", "/v1/completions", "/generate"):
        app.router.add_post(path, generate)
    app.router.add_get("/v1/models", models)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.systems.oracle", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True, help="replica base URL (repeatable)")
    parser.add_argument("--decisions", type=Path, help="append one JSON line per decision to this file")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(args.decisions.open("ab", buffering=0)) if args.decisions else None
        app = build_app(args.backend, log)
        web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
