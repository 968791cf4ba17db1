"""A small, scriptable SGLang-shaped replica for the gateway's own tests (a real aiohttp server).

It answers like SGLang (contract §1-§4) for what the gateway touches, and lets a test inject the
failures the gateway must handle: an HTTP status, a connection reset before any byte, a stream cut
after K chunks, a hang. Everything it sees is recorded (request bodies, headers, aborts).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class FakeReplica:
    model: str = "fake-model"
    chunks: int = 4
    chunk_delay: float = 0.0
    fail_status: list[int] = field(default_factory=list)  # next requests answer these statuses
    reset_next: int = 0  # next N generation requests: connection closed before any byte
    cut_after: int | None = None  # streams stop (connection closed) after this many chunks
    hang: bool = False  # generation requests never answer
    healthy: bool = True
    startup_time: float = field(default_factory=time.time)
    hicache: bool = True
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    cancelled: int = 0
    flushes: int = 0
    served: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_post("/flush_cache", self.flush)
        app.router.add_post("/v1/chat/completions", self.generation)
        app.router.add_post("/v1/completions", self.generation)
        app.router.add_post("/generate", self.generation)
        app.router.add_post("/v1/embeddings", self.echo)
        app.router.add_get("/v1/echo", self.echo)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        info = {
            "model_path": "/models/" + self.model,
            "served_model_name": self.model,
            "page_size": 16,
            "max_total_num_tokens": 100_000,
            "max_running_requests": 32,
            "enable_hierarchical_cache": self.hicache,
            "hicache_ratio": 2.0,
            "hicache_size": 0,
            "hicache_write_policy": "write_back",
            "internal_states": [{"memory_usage": {"token_capacity": 100_000, "kvcache": 1.5}}],
            "startup_time": self.startup_time,
            "status": "ready",
        }
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.model, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
        )

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": self.model, "object": "model", "created": 1, "owned_by": "sglang", "root": self.model}]
        return web.json_response({"object": "list", "data": data})

    async def abort(self, request: web.Request) -> web.Response:
        self.aborts.append((await request.json())["rid"])
        return web.Response()

    async def flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.Response(text="Cache flushed.\n")

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.bodies.append(body)
        return web.json_response({"echo": len(body), "path": request.path, "method": request.method})

    async def generation(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.reset_next > 0:
            self.reset_next -= 1
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(1)
        if self.fail_status:
            status = self.fail_status.pop(0)
            err = {
                "object": "error",
                "message": f"injected {status}",
                "type": "Err",
                "param": None,
                "code": status,
            }
            return web.json_response(err, status=status)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            body = orjson.loads(raw)
            self.served += 1
            if body.get("stream"):
                return await self._stream(request, body)
            return web.Response(
                body=orjson.dumps(self._full(request.path, body)), content_type="application/json"
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _text(self, body: dict[str, Any], i: int) -> str:
        return f"tok{i} "

    def _usage(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("text"))) // 4
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.chunks,
            "total_tokens": prompt + self.chunks,
            "prompt_tokens_details": {"cached_tokens": prompt // 2},
        }

    def _full(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        rid = hashlib.md5(orjson.dumps(body)).hexdigest()
        text = "".join(self._text(body, i) for i in range(self.chunks))
        n = int(body.get("n") or 1)
        if path == "/generate":
            return {
                "text": text,
                "meta_info": {"id": rid, "prompt_tokens": 10, "completion_tokens": 4, "cached_tokens": 3},
            }
        if path == "/v1/completions":
            choices = [
                {"index": i, "text": text, "logprobs": None, "finish_reason": "stop"} for i in range(n)
            ]
            return {
                "id": rid,
                "object": "text_completion",
                "created": 1,
                "model": body["model"],
                "choices": choices,
                "usage": self._usage(body),
            }
        message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": None}
        finish = "stop"
        if body.get("tools") and body["messages"][-1]["role"] == "user":
            fn = body["tools"][0]["function"]["name"]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": fn, "arguments": '{"x": 1}'}}
                ],
            }
            finish = "tool_calls"
        choices = [
            {"index": i, "message": message, "logprobs": None, "finish_reason": finish} for i in range(n)
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": choices,
            "usage": self._usage(body),
        }

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        rid = body.get("rid") or uuid.uuid4().hex
        chat = request.path == "/v1/chat/completions"
        for i in range(self.chunks):
            if self.cut_after is not None and i == self.cut_after:
                assert request.transport is not None
                request.transport.abort()
                return out
            if chat:
                delta = (
                    {"role": "assistant", "content": self._text(body, i)}
                    if i == 0
                    else {"content": self._text(body, i)}
                )
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                chunk = {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": self._text(body, i),
                    "logprobs": None,
                    "finish_reason": "stop" if i == self.chunks - 1 else None,
                }
                chunk = {
                    "id": rid,
                    "object": "text_completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": None,
                }
            await out.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        if chat:
            fin = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                "usage": None,
            }
            await out.write(b"data: " + orjson.dumps(fin) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = "chat.completion.chunk" if chat else "text_completion"
            u = {
                "id": rid,
                "object": obj,
                "created": 1,
                "model": body["model"],
                "choices": [],
                "usage": self._usage(body),
            }
            await out.write(b"data: " + orjson.dumps(u) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out
