"""Every emulator endpoint's shape against the SGLang contract (§1, §2, §4, §5), and its errors."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson

from tests.emulator.conftest import StartEmu

FAST = ("--emu-time-scale", "0.001")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello kv cache"}], "max_tokens": 4}


async def _sse(resp: aiohttp.ClientResponse) -> list[Any]:
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else orjson.loads(data))
    return events


async def test_chat_non_stream_shape(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["object"] == "chat.completion" and body["model"] == "m"
    choice = body["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "matched_stop"}
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert set(choice["message"]) == {"role", "content", "reasoning_content", "tool_calls"}
    usage = body["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens_details"] is None
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert body["metadata"] == {"weight_version": "default"}


async def test_cache_report_and_details(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--enable-cache-report")
    body = dict(CHAT, return_cached_tokens_details=True)
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        first = await resp.json()
    assert first["usage"]["prompt_tokens_details"] is None  # 0 cached → null (0.5.10)
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        second = await resp.json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == second["usage"]["prompt_tokens"] - 1
    assert second["sglext"]["cached_tokens_details"] == {"device": cached, "host": 0}


async def test_chat_stream_chunk_order(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    body = dict(CHAT, stream=True, n=2, stream_options={"include_usage": True})
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await _sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8
    finishes = chunks[-3:-1]
    assert sorted(c["choices"][0]["index"] for c in finishes) == [0, 1]
    for c in finishes:
        assert c["choices"][0]["finish_reason"] == "length"
        assert c["choices"][0]["delta"]["content"] is None
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks[:-3] if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant" and mine[0]["delta"]["content"] == ""
        assert all(c["finish_reason"] is None for c in mine)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_completions_stream_finish_on_last_content(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    emu = await emulator(*FAST)
    body = {"model": "m", "prompt": "once upon", "max_tokens": 3, "stream": True}
    async with http.post(f"{emu.url}/v1/completions", json=body) as resp:
        events = await _sse(resp)
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and len(chunks) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"][0]["text"]
    assert chunks[0]["object"] == "text_completion"


async def test_stop_and_determinism(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    body = {"model": "m", "prompt": "tell me", "max_tokens": 12, "seed": 7}
    async with http.post(f"{emu.url}/v1/completions", json=body) as resp:
        a = (await resp.json())["choices"][0]["text"]
    async with http.post(f"{emu.url}/v1/completions", json=body) as resp:
        assert (await resp.json())["choices"][0]["text"] == a
    word = a.split()[3]
    async with http.post(f"{emu.url}/v1/completions", json=dict(body, stop=[word])) as resp:
        choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == word
    assert choice["text"] == a[: a.index(word)]


async def test_natural_length_without_max_tokens(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        out = await resp.json()
    assert out["choices"][0]["finish_reason"] == "stop"
    assert 16 <= out["usage"]["completion_tokens"] <= 64


async def test_errors(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--context-length", "64")
    async with http.post(f"{emu.url}/v1/chat/completions", json={"model": "m"}) as resp:
        assert resp.status == 400
        err = await resp.json()
    assert err["object"] == "error" and err["code"] == 400 and err["param"] is None
    async with http.post(f"{emu.url}/v1/completions", json={"prompt": "x", "max_tokens": 0}) as resp:
        assert resp.status == 400
        assert "Value error, max_tokens must be positive" in (await resp.json())["message"]
    long = {"prompt": "word " * 100, "max_tokens": 1}
    async with http.post(f"{emu.url}/v1/completions", json=long) as resp:
        msg = (await resp.json())["message"]
    assert re.fullmatch(
        r"The input \(\d+ tokens\) is longer than the model's context length \(64 tokens\)\.", msg
    )
    async with http.post(f"{emu.url}/v1/completions", json={"prompt": "a b", "max_tokens": 100}) as resp:
        assert (await resp.json())["message"].startswith("Requested token count exceeds the model's maximum")
    async with http.post(
        f"{emu.url}/v1/completions", data=b"{}", headers={"Content-Type": "text/plain"}
    ) as resp:
        assert resp.status == 400 and (await resp.json())["type"] == "Bad Request"
    async with http.post(f"{emu.url}/generate", json={"sampling_params": {}}) as resp:
        assert resp.status == 400 and "message" in (await resp.json())["error"]


async def test_generate_native(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    body = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 0}}
    async with http.post(f"{emu.url}/generate", json=body) as resp:
        warm = await resp.json()
    assert warm["text"] == "" and warm["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    streamed: dict[str, object] = {
        "input_ids": list(range(100, 150)),
        "sampling_params": {"max_new_tokens": 3},
    }
    async with http.post(f"{emu.url}/generate", json=streamed | {"stream": True}) as resp:
        events = await _sse(resp)
    texts = [e["text"] for e in events[:-1]]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))  # cumulative
    meta = events[-2]["meta_info"]
    assert meta["cached_tokens"] == 40 and meta["cached_tokens_details"] == {"device": 40, "host": 0}
    assert meta["finish_reason"] == {"type": "length", "length": 3} and meta["completion_tokens"] == 3
    assert {"id", "prompt_tokens", "weight_version", "e2e_latency"} <= set(meta)


async def test_info_routes(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--enable-hierarchical-cache", "--served-model-name", "qwen")
    async with http.get(f"{emu.url}/get_server_info") as resp:
        info = await resp.json()
    assert info["max_total_num_tokens"] == 159746 and info["status"] == "ready"
    assert info["enable_hierarchical_cache"] is True and info["hicache_write_policy"] == "write_through"
    mem = info["internal_states"][0]["memory_usage"]
    assert mem["token_capacity"] == 159746 and set(mem) == {"weight", "kvcache", "token_capacity", "graph"}
    async with http.get(f"{emu.url}/model_info") as resp:
        model = await resp.json()
    assert model["architectures"] == ["Qwen3ForCausalLM"] and model["is_generation"] is True
    async with http.get(f"{emu.url}/v1/models") as resp:
        card = (await resp.json())["data"][0]
    assert card["id"] == "qwen" and card["owned_by"] == "sglang" and card["max_model_len"] == 262144
    async with http.get(f"{emu.url}/v1/models/other") as resp:
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"
    async with http.get(f"{emu.url}/get_load") as resp:
        load = await resp.json()
    assert isinstance(load, list) and {"num_tokens", "num_reqs", "num_waiting_reqs"} <= set(load[0])
    async with http.get(f"{emu.url}/v1/loads") as resp:
        loads = await resp.json()
    assert loads["dp_rank_count"] == 1 and loads["loads"][0]["max_total_num_tokens"] == 159746
    async with http.get(f"{emu.url}/health") as resp:
        assert resp.status == 200 and await resp.read() == b""
    async with http.get(f"{emu.url}/metrics") as resp:
        assert resp.status == 404  # only with --enable-metrics


async def test_flush_and_metrics(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--enable-metrics", "--enable-hierarchical-cache")
    async with http.post(
        f"{emu.url}/generate", json={"text": "a b c d e f", "sampling_params": {"max_new_tokens": 2}}
    ):
        pass
    async with http.post(
        f"{emu.url}/generate", json={"text": "a b c d e f", "sampling_params": {"max_new_tokens": 2}}
    ):
        pass
    async with http.get(f"{emu.url}/metrics") as resp:
        text = await resp.text()
    for name in ("num_running_reqs", "token_usage", "hicache_host_total_tokens", "cache_hit_rate"):
        assert f"sglang:{name}{{" in text
    assert 'sglang:cached_tokens_total{cache_source="device"' in text
    assert "sglang:time_to_first_token_seconds_bucket" in text and "sglang:num_requests_total" in text
    async with http.post(f"{emu.url}/flush_cache") as resp:
        assert resp.status == 200 and (await resp.text()).startswith("Cache flushed.")
    assert emu.replica.engine.cache.stats().gpu_cached == 0


async def test_api_key(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--api-key", "sk-test")
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 401
    headers = {"Authorization": "Bearer sk-test"}
    async with http.post(f"{emu.url}/v1/chat/completions", json=CHAT, headers=headers) as resp:
        assert resp.status == 200


async def test_debug_state_and_predict(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--emu-debug")
    body = {"model": "m", "prompt": "word " * 200, "max_tokens": 1}
    async with http.post(f"{emu.url}/_emu/predict", json={"path": "/v1/completions", "body": body}) as resp:
        cold = await resp.json()
    assert cold["gpu_tokens"] == 0 and cold["ttft_s"] > 0.1
    async with http.post(f"{emu.url}/v1/completions", json=body) as resp:
        assert resp.headers["x-emu-replica"] == emu.url.removeprefix("http://")
    async with http.post(f"{emu.url}/_emu/predict", json={"path": "/v1/completions", "body": body}) as resp:
        warm = await resp.json()
    assert warm["gpu_tokens"] >= warm["prompt_tokens"] - 1 and warm["ttft_s"] < cold["ttft_s"]
    async with http.get(f"{emu.url}/_emu/state") as resp:
        state = await resp.json()
    assert state["requests_total"] == 1 and state["prompt_tokens_total"] == warm["prompt_tokens"]
    assert {"waiting", "running", "queued_prefill_tokens", "predicted_queue_s"} <= set(state["queue"])


async def test_tool_call(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--tool-call-parser", "qwen25")
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
    body = dict(CHAT, tools=[tool])
    async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
        choice = (await resp.json())["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert set(orjson.loads(call["function"]["arguments"])) == {"city", "days"}
    messages = [{"role": "user", "content": "hello kv cache"}, {"role": "tool", "content": "sunny"}]
    after_tool = dict(body, messages=messages)
    async with http.post(f"{emu.url}/v1/chat/completions", json=after_tool) as resp:
        assert (await resp.json())["choices"][0]["message"]["tool_calls"] is None


async def test_cache_salt_namespaces_and_tokenize(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--enable-cache-report")
    for salt, expect_cached in (("tenant-a", False), ("tenant-a", True), ("tenant-b", False)):
        async with http.post(f"{emu.url}/v1/chat/completions", json=dict(CHAT, cache_salt=salt)) as resp:
            details = (await resp.json())["usage"]["prompt_tokens_details"]
        assert (details is not None) is expect_cached
    async with http.post(f"{emu.url}/v1/chat/completions", json=dict(CHAT, cache_salt=3)) as resp:
        assert resp.status == 400
    async with http.post(f"{emu.url}/tokenize", json={"prompt": "hello kv cache"}) as resp:
        tok = await resp.json()
    assert tok["count"] == len(tok["tokens"]) > 0
    async with http.post(f"{emu.url}/detokenize", json={"tokens": tok["tokens"]}) as resp:
        assert (await resp.json())["text"] == "hello kv cache"


async def test_tool_calls_are_parsed_by_default(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    body = dict(CHAT, tools=[tool])
    for flags, finish in (((), "tool_calls"), (("--tool-call-parser", "none"), "length")):
        emu = await emulator(*FAST, *flags)
        async with http.post(f"{emu.url}/v1/chat/completions", json=body) as resp:
            choice = (await resp.json())["choices"][0]
        assert choice["finish_reason"] == finish
        assert (choice["message"]["tool_calls"] is None) == (finish == "length")
    async with http.get(f"{emu.url}/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "kvroute-emu"  # the default served model name


async def test_completions_batch(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST, "--enable-cache-report")
    single = {"model": "m", "max_tokens": 3, "n": 2}
    prompts = ["first prompt here", "the second one"]
    alone = []
    for prompt in prompts:
        async with http.post(f"{emu.url}/v1/completions", json=single | {"prompt": prompt}) as resp:
            alone.append(await resp.json())
    batch = single | {"prompt": prompts, "echo": True}
    async with http.post(f"{emu.url}/v1/completions", json=batch) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    expected = [p + c["text"] for p, a in zip(prompts, alone, strict=True) for c in a["choices"]]
    assert [c["text"] for c in out["choices"]] == expected  # choice k*n+i: choice i of prompt k, echoed
    usage = out["usage"]
    assert usage["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 2  # both seen before
    ids = {"model": "m", "max_tokens": 2, "prompt": [[11, 12, 13], [21, 22]]}
    async with http.post(f"{emu.url}/v1/completions", json=ids) as resp:
        assert len((await resp.json())["choices"]) == 2


async def test_completions_batch_stream(emulator: StartEmu, http: aiohttp.ClientSession) -> None:
    emu = await emulator(*FAST)
    body = {"model": "m", "prompt": ["one two", "three"], "n": 2, "max_tokens": 3, "stream": True}
    async with http.post(
        f"{emu.url}/v1/completions", json=body | {"stream_options": {"include_usage": True}}
    ) as resp:
        events = await _sse(resp)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    texts = {
        i: "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in range(4)
    }
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"] == "length"]
    assert sorted(finishes) == [0, 1, 2, 3] and all(texts.values())
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    async with http.post(f"{emu.url}/v1/completions", json=body | {"stream": False}) as resp:
        whole = await resp.json()
    assert [c["text"] for c in whole["choices"]] == [texts[i] for i in range(4)]
    assert whole["usage"]["prompt_tokens"] == usage_chunk["usage"]["prompt_tokens"]
