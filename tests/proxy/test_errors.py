"""Every error the gateway produces: status and OpenAI shape {"error": {message, type, param, code}}."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.proxy.conftest import EMU_FLAGS, MODEL, Stack, StackFactory, wait_for

MSG = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}


async def _post(url: str, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.post(url + path, data=body, headers=JSON) as r:
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
        (orjson.dumps({"model": MODEL}), 400, "messages", None),
        (orjson.dumps({"model": MODEL, "messages": [{"content": "x"}]}), 400, "messages[0]", None),
        (orjson.dumps({"model": MODEL, "messages": MSG, "stream": "yes"}), 400, "stream", None),
        (orjson.dumps({"model": MODEL, "messages": MSG, "n": 0}), 400, "n", None),
        (orjson.dumps({"model": MODEL, "messages": MSG, "max_tokens": "many"}), 400, "max_tokens", None),
        (orjson.dumps({"model": "unknown", "messages": MSG}), 404, "model", "model_not_found"),
    ],
)
async def test_chat_validation_errors(
    stack_factory: StackFactory, body: bytes, status: int, param: str | None, code: str | None
) -> None:
    stack = await stack_factory(single_model_fallback=False)  # unknown names are a 404
    got_status, err = await _post(stack.url, body)
    assert got_status == status
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == code
    assert err["type"] == "invalid_request_error"
    assert await stack.generations() == []  # nothing reached a replica


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [1, "a"]}, "prompt"),
        ("/generate", {"sampling_params": {}}, "text"),
    ],
)
async def test_completions_and_generate_validation(
    stack: Stack, path: str, body: dict[str, object], param: str
) -> None:
    status, err = await _post(stack.url, orjson.dumps(body), path)
    assert status == 400 and err["param"] == param
    assert await stack.generations() == []


async def test_body_over_limit_is_413(stack_factory: StackFactory) -> None:
    stack = await stack_factory(max_body_bytes=1000)
    status, err = await _post(
        stack.url,
        orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}),
    )
    assert status == 413 and err["code"] == "payload_too_large"

    async def chunked() -> object:
        for _ in range(20):
            yield b"x" * 100

    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/chat/completions", data=chunked()) as r:
        assert r.status == 413 and (await r.json())["error"]["code"] == "payload_too_large"
    assert await stack.generations() == []


async def test_no_healthy_replica_is_503(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="unhealthy")  # /health answers 503 until cleared
    await wait_for(lambda: not any(r.healthy for r in stack.gw.fleet.replicas()))
    status, err = await _post(stack.url, orjson.dumps({"model": MODEL, "messages": MSG}))
    assert status == 503 and err["code"] == "no_replica_available" and err["type"] == "service_unavailable"
    assert await stack.generations() == []


async def test_all_replicas_unreachable_is_502(stack: Stack) -> None:
    for r in stack.replicas:
        await r.fault(action="reset", count=5)  # every connection reset before any byte
    status, err = await _post(stack.url, orjson.dumps({"model": MODEL, "messages": MSG}))
    assert status == 502 and err["code"] == "upstream_unavailable"
    seen = await stack.generations()
    assert [e["outcome"] for e in seen] == ["reset"] * 3  # 1 + retries=2 attempts, no more


async def test_unknown_model_on_models_endpoint(stack_factory: StackFactory) -> None:
    stack = await stack_factory(single_model_fallback=False)
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.url + "/v1/models/nope") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        async with s.get(stack.url + f"/v1/models/{MODEL}") as r:
            card = await r.json()
            assert r.status == 200 and card["id"] == MODEL
        async with s.get(stack.urls[0] + f"/v1/models/{MODEL}") as r:
            assert card == await r.json()  # the replica's own model card


async def test_routes_only_to_replicas_serving_the_model(stack: Stack) -> None:
    # replica 1 is restarted at the same address serving another model; the info refresh picks it up
    old = stack.replicas[1]
    await stack.emulators.stop(old)
    new = await stack.emulators(*EMU_FLAGS, "--served-model-name", "other-model", port=old.port)
    assert new.url == stack.urls[1]
    stack.replicas[1] = new
    fleet = stack.gw.fleet
    await wait_for(lambda: fleet.models() == {MODEL, "other-model"})
    async with aiohttp.ClientSession() as s:
        for model, target in [("other-model", 1)] * 4 + [(MODEL, 0)] * 2:
            body = orjson.dumps({"model": model, "messages": MSG, "max_tokens": 2})
            async with s.post(stack.url + "/v1/chat/completions", data=body, headers=JSON) as r:
                assert r.status == 200 and r.headers["x-kvroute-replica"] == stack.urls[target]
    assert len(await new.generations()) == 4 and len(await stack.replicas[0].generations()) == 2
