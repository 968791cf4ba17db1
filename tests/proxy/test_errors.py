"""Every error the gateway produces: status and OpenAI shape {"error": {message, type, param, code}}."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy.context import GATEWAY
from tests.proxy.conftest import Stack, StackFactory, wait_for

MSG = [{"role": "user", "content": "hi"}]


async def _post(url: str, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        return r.status, (await r.json())["error"]


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (b"{not json", 400, None, None),
        (b"[1, 2]", 400, None, None),
        (b"", 400, None, None),
        (orjson.dumps({"messages": MSG}), 400, "model", None),
        (orjson.dumps({"model": 7, "messages": MSG}), 400, "model", None),
        (orjson.dumps({"model": "fake-model"}), 400, "messages", None),
        (orjson.dumps({"model": "fake-model", "messages": [{"content": "x"}]}), 400, "messages[0]", None),
        (orjson.dumps({"model": "fake-model", "messages": MSG, "stream": "yes"}), 400, "stream", None),
        (orjson.dumps({"model": "fake-model", "messages": MSG, "n": 0}), 400, "n", None),
        (
            orjson.dumps({"model": "fake-model", "messages": MSG, "max_tokens": "many"}),
            400,
            "max_tokens",
            None,
        ),
        (orjson.dumps({"model": "unknown", "messages": MSG}), 404, "model", "model_not_found"),
    ],
)
async def test_chat_validation_errors(
    stack: Stack, body: bytes, status: int, param: str | None, code: str | None
) -> None:
    got_status, err = await _post(stack.url, body)
    assert got_status == status
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == code
    assert err["type"] == "invalid_request_error"
    assert sum(len(r.bodies) for r in stack.replicas) == 0  # nothing reached a replica


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "fake-model"}, "prompt"),
        ("/v1/completions", {"model": "fake-model", "prompt": [1, "a"]}, "prompt"),
        ("/generate", {"sampling_params": {}}, "text"),
    ],
)
async def test_completions_and_generate_validation(
    stack: Stack, path: str, body: dict[str, object], param: str
) -> None:
    status, err = await _post(stack.url, orjson.dumps(body), path)
    assert status == 400 and err["param"] == param


async def test_body_over_limit_is_413(stack_factory: StackFactory) -> None:
    stack = await stack_factory(max_body_bytes=1000)
    status, err = await _post(
        stack.url,
        orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "x" * 2000}]}),
    )
    assert status == 413 and err["code"] == "payload_too_large"

    async def chunked() -> object:
        for _ in range(20):
            yield b"x" * 100

    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", data=chunked()) as r:
        assert r.status == 413 and (await r.json())["error"]["code"] == "payload_too_large"


async def test_no_healthy_replica_is_503(stack: Stack) -> None:
    for r in stack.replicas:
        r.healthy = False
    await wait_for(lambda: not any(r.healthy for r in stack.app[GATEWAY].fleet.replicas()))
    status, err = await _post(stack.url, orjson.dumps({"model": "fake-model", "messages": MSG}))
    assert status == 503 and err["code"] == "no_replica_available" and err["type"] == "service_unavailable"


async def test_all_replicas_unreachable_is_502(stack: Stack) -> None:
    for r in stack.replicas:
        r.reset_next = 5
    status, err = await _post(stack.url, orjson.dumps({"model": "fake-model", "messages": MSG}))
    assert status == 502 and err["code"] == "upstream_unavailable"


async def test_unknown_model_on_models_endpoint(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/models/nope") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/models/fake-model") as r:
        assert r.status == 200 and (await r.json())["id"] == "fake-model"


async def test_routes_only_to_replicas_serving_the_model(stack: Stack) -> None:
    stack.replicas[1].model = "other-model"
    fleet = stack.app[GATEWAY].fleet
    await wait_for(lambda: fleet.models() == {"fake-model", "other-model"})  # info refresh picks it up
    for _ in range(4):
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                stack.url + "/v1/chat/completions",
                data=orjson.dumps({"model": "other-model", "messages": MSG}),
            ) as r,
        ):
            assert r.status == 200 and r.headers["x-kvroute-replica"] == stack.urls[1]
