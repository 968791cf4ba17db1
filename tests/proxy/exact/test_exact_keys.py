"""The gateway with ``--tokenizer-path emulator/model_bpe`` in front of real emulators: requests are keyed
by the engine's token ids (exact estimates, per-64-token blocks), unrenderable ones keep text keys, and
/status and /metrics say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
from tokenizers import Tokenizer

from routing.config import RoutingConfig
from tests.proxy.conftest import ADMIN, MODEL, StackFactory, post
from tests.proxy.prom import value

DIR = Path(__file__).resolve().parents[3] / "emulator" / "model_bpe"
RAW = Tokenizer.from_file(str(DIR / "tokenizer.json"))
JSON = {"Content-Type": "application/json"}
DOC = {"role": "system", "content": "Reference document. " + "The river bends north at the mill. " * 60}


def _ids(messages: list[dict[str, Any]]) -> list[int]:
    """ChatML as the template in model_bpe renders it (with the generation prompt), encoded directly."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    ids: list[int] = RAW.encode(text + "<|im_start|>assistant\n", add_special_tokens=False).ids
    return ids


def _chat(question: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [DOC, {"role": "user", "content": question}], "max_tokens": 4}


async def _preview(url: str, body: dict[str, Any]) -> Any:
    status, raw, _ = await post(url, "/admin/route/v1/chat/completions", orjson.dumps(body), ADMIN)
    assert status == 200, raw
    return orjson.loads(raw)["predicted"]


async def test_chats_are_keyed_by_token_ids_and_fallbacks_counted(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=2, policy="cost", tokenizer_path=str(DIR))
    first = _chat("Where does the river bend?")
    assert (await _preview(stack.url, first))["prompt_tokens"] == len(_ids(first["messages"]))  # exact
    status, raw, _ = await post(stack.url, "/v1/chat/completions", orjson.dumps(first), JSON)
    assert status == 200, raw
    second = _chat("And the mill?")
    shared = len(_ids([DOC, {"role": "user", "content": ""}])) - 8  # the system turn and "<|im_start|>user\n"
    cached = (await _preview(stack.url, second))["cached_tokens"]["gpu"]
    block = RoutingConfig().token_block
    assert cached % block == 0 and shared - 2 * block < cached <= shared  # the shared text ends mid-block
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    multimodal = {"model": MODEL, "messages": [{"role": "user", "content": [image]}]}
    assert (await _preview(stack.url, multimodal))["prompt_tokens"] >= 1  # text keys: still routed
    section = (await _status(stack.url))["tokenizer"]
    assert section["enabled"] and section["chat_template"]
    assert section["tokenized"] == 3 and section["fallback"] == {"multimodal": 1}
    assert section["prefix_cache"]["hits"] >= 1
    text = stack.metrics()
    assert value(text, "kvroute_tokenizer", field="tokenized") == 3.0
    assert value(text, "kvroute_tokenizer", field="fallback_multimodal") == 1.0
    assert value(text, "kvroute_tokenize_seconds_count", mode="inline") == 3.0


async def test_without_a_tokenizer_status_says_off(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    assert (await _status(stack.url))["tokenizer"] == {"enabled": False}
    assert value(stack.metrics(), "kvroute_tokenizer", field="enabled") == 0.0


async def _status(url: str) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url + "/status", headers={"Accept": "application/json"} | ADMIN) as r,
    ):
        assert r.status == 200
        return await r.json()


async def test_warmed_documents_are_keyed_like_the_requests_that_use_them(
    stack_factory: StackFactory,
) -> None:
    stack = await stack_factory(n=2, policy="cost", tokenizer_path=str(DIR))
    docs = [
        {
            "id": f"d{i}",
            "messages": [{"role": "system", "content": f"Manual {i}. " + "Turn the valve. " * 150}],
        }
        for i in range(2)
    ]
    body = {"model": MODEL, "documents": docs, "wait": True}
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/warmup", json=body, headers=ADMIN) as r:
        job = await r.json()
        assert r.status == 200 and job["status"] == "done", job
    for i, d in enumerate(job["documents"]):
        assert d["tokens"] == len(_ids(docs[i]["messages"]))  # exact: the template's ids
        (placement,) = d["replicas"]
        question = {"model": MODEL, "messages": [*docs[i]["messages"], {"role": "user", "content": "How?"}]}
        status, raw, _ = await post(
            stack.url, "/admin/route/v1/chat/completions", orjson.dumps(question), ADMIN
        )
        preview = orjson.loads(raw)
        assert status == 200 and preview["replica"] == placement["replica"]
        assert preview["predicted"]["cached_tokens"]["gpu"] >= d["tokens"] - 64 - 5
