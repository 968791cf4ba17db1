"""The admin route preview (proxy/admin/preview.py): the decision the gateway would take now, nothing
forwarded, nothing recorded; the same answer from every gateway that shares one view."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from tests.proxy.conftest import ADMIN, MODEL, SYSTEM, Stack, StackFactory, post

JSON = {"Content-Type": "application/json"}
DOC = {"role": "system", "content": "Reference document. " + "The river bends north at the mill. " * 60}


def _chat(question: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [DOC, {"role": "user", "content": question}], "max_tokens": 4}


async def _preview(stack: Stack, body: dict[str, Any], path: str = "v1/chat/completions") -> Any:
    status, raw, _ = await post(stack.url, f"/admin/route/{path}", orjson.dumps(body), ADMIN)
    assert status == 200, raw
    return orjson.loads(raw)


async def test_preview_names_the_holder_and_records_nothing(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=3, policy="cost")
    before = await _preview(stack, _chat("Where does the river bend?"))
    assert before["replica"] in stack.urls and sorted(before["ranked"]) == sorted(stack.urls)
    assert before["predicted"]["cached_tokens"] == {"gpu": 0.0, "host": 0.0, "storage": 0.0}
    assert before["predicted"]["ttft_s"] > 0 and before["predicted"]["prompt_tokens"] > 400
    assert await stack.generations() == []  # nothing was forwarded
    again = await _preview(stack, _chat("Where does the river bend?"))
    assert again == before  # nothing was recorded: the same question gets the same answer
    status, raw, headers = await post(
        stack.url, "/v1/chat/completions", orjson.dumps(_chat("A first question?")), JSON
    )
    assert status == 200, raw
    holder = headers["x-kvroute-replica"]
    repeat = await _preview(stack, _chat("A second question?"))
    assert repeat["replica"] == holder and repeat["predicted"]["cached_tokens"]["gpu"] > 400
    assert len(await stack.generations()) == 1


async def test_preview_of_generate_and_bad_requests(stack: Stack) -> None:
    gen = await _preview(stack, {"text": "hello there", "sampling_params": {"max_new_tokens": 2}}, "generate")
    assert gen["replica"] in stack.urls
    chat = orjson.dumps({"model": MODEL, "messages": [SYSTEM]})
    async with aiohttp.ClientSession() as s:
        async with s.post(stack.url + "/admin/route/v1/chat/completions", data=chat) as r:
            assert r.status == 401  # behind the admin key
        async with s.post(stack.url + "/admin/route/v1/embeddings", data=chat, headers=ADMIN) as r:
            assert r.status == 404 and "known" in (await r.json())["error"]["message"]
        async with s.post(stack.url + "/admin/route/v1/chat/completions", data=b"{", headers=ADMIN) as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
