"""Prefill/decode disaggregation (pd-contract.md §2, §5): emulated prefill and decode servers paired by a
bootstrap room, in one process (the decode calls the prefill's rooms directly) and in two (over the
prefill's bootstrap server), their timeouts and aborts with SGLang's errors, their PD reports, and the
real sglang-router 0.3.2 in `--pd-disaggregation` mode routing a 1 prefill + 1 decode pair unchanged.

Every request goes to both servers at once with the same fields, as the router sends it. Time is scaled
by 0.01, so SGLang's 300 s timeouts are 3 s here unless a test shortens them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from bench.systems.procs import ManagedProcess, free_ports
from bench.systems.registry import SGLANG_ENV, counts
from emulator.pd_runs import PD_ROLE
from tests.conftest import wait_for
from tests.emulator.conftest import Emu, StartEmu
from tests.emulator.sdk import streamed_chat

FAST = ("--emu-time-scale", "0.01", "--enable-cache-report", "--enable-metrics", "--emu-debug")
PREFILL = (*FAST, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0")
DECODE = (*FAST, "--disaggregation-mode", "decode")
LOOP = "127.0.0.1"
CHAT = [{"role": "user", "content": "tell me about disaggregated serving " * 8}]


def fields(prefill: Emu, room: int) -> dict[str, Any]:
    return {
        "bootstrap_host": LOOP,
        "bootstrap_port": prefill.replica.pd.bootstrap_port,
        "bootstrap_room": room,
    }


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def pair_post(
    http: aiohttp.ClientSession, prefill: str, decode: str, path: str, body: dict[str, Any]
) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """The router's dual dispatch: the same body to both servers, concurrently."""
    both = await asyncio.gather(post(http, prefill + path, body), post(http, decode + path, body))
    return both[0], both[1]


async def sse(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """A streamed answer: its status and its events (JSON, or the string "[DONE]")."""
    async with http.post(url, json=body) as resp:
        raw = (await resp.read()).decode()
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    return resp.status, [e if e == "[DONE]" else json.loads(e) for e in events]


@pytest.fixture
async def pair(emulator: StartEmu) -> tuple[Emu, Emu]:
    return await emulator(*PREFILL), await emulator(*DECODE)


# ---- the pair protocol ---------------------------------------------------------------------------
async def test_a_pair_in_one_process_answers_with_the_prefills_cache(
    pair: tuple[Emu, Emu], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    body = {"model": "m", "messages": CHAT, "max_tokens": 6}
    answers = [
        await pair_post(http, prefill.url, decode.url, "/v1/chat/completions", body | fields(prefill, r))
        for r in (11, 12)
    ]
    for (p_status, p_body), (d_status, d_body) in answers:
        assert p_status == d_status == 200
        first, full = p_body["choices"][0], d_body["choices"][0]
        assert (first["finish_reason"], p_body["usage"]["completion_tokens"]) == ("length", 1)
        assert full["message"]["content"].startswith(first["message"]["content"])  # the prefill's token is #1
        assert d_body["usage"]["completion_tokens"] == 6
        assert d_body["usage"]["prompt_tokens"] == p_body["usage"]["prompt_tokens"]
    _, (_, cold_d) = answers[0]
    (_, warm), (_, warm_d) = answers[1]
    assert cold_d["usage"]["prompt_tokens_details"] is None  # nothing cached on the first turn
    hit = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit > 0 and warm_d["usage"]["prompt_tokens_details"] == {"cached_tokens": hit}  # from the prefill
    gen = {"text": "a native request " * 5, "sampling_params": {"max_new_tokens": 4}} | fields(
        prefill, 2**63 - 1
    )
    (p_status, p_gen), (d_status, d_gen) = await pair_post(http, prefill.url, decode.url, "/generate", gen)
    assert p_status == d_status == 200
    assert p_gen["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert p_gen["meta_info"]["completion_tokens"] == 1 and len(d_gen["output_ids"]) == 4
    assert d_gen["output_ids"][0] == p_gen["output_ids"][0]
    assert d_gen["meta_info"]["cached_tokens"] == p_gen["meta_info"]["cached_tokens"]


async def test_batches_take_one_room_per_prompt(pair: tuple[Emu, Emu], http: aiohttp.ClientSession) -> None:
    """Chat with n choices gets list fields (one room per choice: the emulator's one Job takes the first);
    a completions batch with a scalar room pairs prompt k in room + k, as SGLang expands it."""
    prefill, decode = pair
    port = prefill.replica.pd.bootstrap_port
    arrays = {"bootstrap_host": [LOOP, LOOP], "bootstrap_port": [port, None], "bootstrap_room": [500, 900]}
    body = {"model": "m", "messages": CHAT, "max_tokens": 3, "n": 2, **arrays}
    (p_status, p_body), (d_status, d_body) = await pair_post(
        http, prefill.url, decode.url, "/v1/chat/completions", body
    )
    assert p_status == d_status == 200 and len(p_body["choices"]) == len(d_body["choices"]) == 2
    assert p_body["usage"]["completion_tokens"] == 2 and d_body["usage"]["completion_tokens"] == 6
    batch = {"model": "m", "prompt": ["first prompt", "second prompt"], "max_tokens": 2} | fields(
        prefill, 700
    )
    (p_status, p_body), (d_status, d_body) = await pair_post(
        http, prefill.url, decode.url, "/v1/completions", batch
    )
    assert p_status == d_status == 200
    texts = [(p["text"], d["text"]) for p, d in zip(p_body["choices"], d_body["choices"], strict=True)]
    assert len(texts) == 2 and all(full.startswith(first) for first, full in texts)


async def test_the_decode_may_register_before_the_prefill_request_comes(
    pair: tuple[Emu, Emu], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    rooms = prefill.app[PD_ROLE].rooms
    assert rooms is not None
    body = {"model": "m", "prompt": "the decode is early", "max_tokens": 3} | fields(prefill, 77)
    early = asyncio.create_task(post(http, decode.url + "/v1/completions", body))
    await wait_for(lambda: 77 in rooms.rooms and rooms.rooms[77].arrived.is_set())
    status, first = await post(http, prefill.url + "/v1/completions", body)
    d_status, full = await early
    assert status == d_status == 200 and full["choices"][0]["text"].startswith(first["choices"][0]["text"])
    assert not rooms.rooms  # both sides are done with the room


async def test_a_pair_in_two_processes_streams_through_the_bootstrap_server(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    p_port, d_port, b_port = free_ports(3)
    base = [sys.executable, "-m", "emulator", "--host", LOOP, *FAST]
    p_url, d_url = f"http://{LOOP}:{p_port}", f"http://{LOOP}:{d_port}"
    p_argv = [
        *base,
        "--port",
        str(p_port),
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(b_port),
    ]
    d_argv = [*base, "--port", str(d_port), "--disaggregation-mode", "decode"]
    prefill_proc = ManagedProcess(p_argv, [p_url], tmp_path / "p.log")
    async with prefill_proc, ManagedProcess(d_argv, [d_url], tmp_path / "d.log"):
        boot = f"http://{LOOP}:{b_port}"
        async with http.get(boot + "/health") as resp:
            assert (resp.status, await resp.text()) == (200, "OK")
        async with http.get(
            boot + "/route",
            params={
                k: "-1" for k in ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
            },
        ) as resp:
            assert (await resp.json())["follow_bootstrap_room"] is True
        async with http.get(boot + "/route", params={"prefill_dp_rank": "0"}) as resp:
            assert resp.status == 400
        body = {
            "model": "m",
            "messages": CHAT,
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
            "bootstrap_host": LOOP,
            "bootstrap_port": b_port,
            "bootstrap_room": 5,
        }
        (p_status, p_events), (d_status, d_events) = await asyncio.gather(
            sse(http, p_url + "/v1/chat/completions", body), sse(http, d_url + "/v1/chat/completions", body)
        )
        assert p_status == d_status == 200 and p_events[-1] == d_events[-1] == "[DONE]"
        text = "".join(c["delta"]["content"] or "" for e in d_events[:-1] for c in e["choices"])
        first = "".join(c["delta"]["content"] or "" for e in p_events[:-1] for c in e["choices"])
        assert first and text.startswith(first)
        assert (
            p_events[-2]["usage"]["completion_tokens"] == 1
            and d_events[-2]["usage"]["completion_tokens"] == 5
        )
        again = body | {"stream": False, "bootstrap_room": 6}
        (_, p_body), (_, d_body) = await pair_post(http, p_url, d_url, "/v1/chat/completions", again)
        cached = d_body["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and cached == p_body["usage"]["prompt_tokens_details"]["cached_tokens"]
        orphan = asyncio.create_task(
            post(http, d_url + "/v1/chat/completions", again | {"bootstrap_room": 7})
        )

        async def waiting() -> bool:
            async with http.get(d_url + "/v1/loads", params={"include": "disagg"}) as resp:
                return bool((await resp.json())["loads"][0]["disaggregation"]["decode_transfer_queue_reqs"])

        await wait_for(waiting)
        assert prefill_proc.pid is not None
        os.kill(prefill_proc.pid, signal.SIGKILL)  # it dies unannounced: the decode's heartbeat notices
        status, err = await orphan
        assert status == 500 and err["message"].startswith("Decode transfer failed for request rank=0")
        assert err["message"].endswith(
            f"Losing connection with prefill instance (bootstrap_addr: {LOOP}:{b_port})"
        )


async def test_one_process_serves_a_prefill_and_a_decode_that_pair_in_process(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    p_port, d_port, b_port = free_ports(3)
    argv = [sys.executable, "-m", "emulator", "--host", LOOP, "--ports", f"{p_port},{d_port}", *FAST]
    argv += ["--disaggregation-mode", "prefill,decode", "--disaggregation-bootstrap-port", str(b_port)]
    p_url, d_url = f"http://{LOOP}:{p_port}", f"http://{LOOP}:{d_port}"
    async with ManagedProcess(argv, [p_url, d_url], tmp_path / "pd.log"):
        modes = []
        for url in (p_url, d_url):
            async with http.get(url + "/server_info") as resp:
                info = await resp.json()
            modes.append((info["disaggregation_mode"], info["disable_radix_cache"]))
        assert modes == [("prefill", False), ("decode", True)]
        body = {
            "text": "one process, two roles",
            "bootstrap_host": LOOP,
            "bootstrap_port": b_port,
            "bootstrap_room": 1,
        }
        (p_status, p_gen), (d_status, d_gen) = await pair_post(http, p_url, d_url, "/generate", body)
        assert p_status == d_status == 200 and d_gen["output_ids"][0] == p_gen["output_ids"][0]


async def test_the_transfer_time_is_the_prompts_kv_over_the_rate(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    rate = ("--emu-kv-transfer-gb-s", "2", "--emu-kv-bytes-per-token", "65536")
    prefill = await emulator(*PREFILL, *rate)
    decode = await emulator(*DECODE)
    latencies = []
    for room, tokens in ((1, 500), (2, 1000), (3, 2000)):
        body = {"input_ids": list(range(100, 100 + tokens)), "sampling_params": {"max_new_tokens": 2}}
        (p_status, _), (d_status, _) = await pair_post(
            http, prefill.url, decode.url, "/generate", body | fields(prefill, room)
        )
        assert p_status == d_status == 200
        async with http.get(prefill.url + "/v1/loads", params={"include": "disagg"}) as resp:
            section = (await resp.json())["loads"][0]["disaggregation"]
        latencies.append(section["kv_transfer_latency_ms"])
        assert section["kv_transfer_speed_gb_s"] == pytest.approx(2.0)
    assert latencies == pytest.approx(
        [tokens * 65536 / 2e9 * 1e3 for tokens in (500, 1000, 2000)]
    )  # 16.4, 32.8, 65.5 ms


# ---- timeouts, failures, aborts ------------------------------------------------------------------
async def test_a_decode_whose_prefill_never_comes_times_out(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    prefill = await emulator(*PREFILL)
    decode = await emulator(*DECODE, "--emu-disaggregation-waiting-timeout", "2")
    body = {"model": "m", "messages": CHAT, "max_tokens": 3} | fields(prefill, 42)
    status, err = await post(http, decode.url + "/v1/chat/completions", body)
    assert status == 500 and (err["object"], err["type"], err["code"], err["param"]) == (
        "error",
        "500",
        500,
        None,
    )
    assert err["message"].startswith("Decode transfer failed for request rank=0 decode_req.req.rid=")
    timed_out = r"KVTransferError\(bootstrap_room=42\): Request 42 timed out after \d+\.\ds in KVPoll"
    assert re.search(timed_out + r"\.WaitingForInput$", err["message"])
    status, events = await sse(
        http, decode.url + "/v1/chat/completions", body | {"stream": True, "bootstrap_room": 43}
    )
    assert status == 200 and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert (error["type"], error["code"]) == (
        "INTERNAL_SERVER_ERROR",
        500,
    ) and "KVPoll.WaitingForInput" in error["message"]


async def test_a_prefill_whose_decode_never_comes_times_out(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    prefill = await emulator(*PREFILL, "--emu-disaggregation-bootstrap-timeout", "2")
    status, err = await post(http, prefill.url + "/generate", {"text": "alone", **fields(prefill, 9)})
    assert status == 500 and err["type"] == "500"
    assert err["message"].startswith("Prefill bootstrap failed for request rank=0 req.rid=")
    assert "Request 9 timed out after" in err["message"] and err["message"].endswith(
        "in KVPoll.Bootstrapping"
    )
    async with http.get(prefill.url + "/metrics") as resp:
        assert re.search(
            r'sglang:num_bootstrap_failed_reqs_total\{engine_type="prefill".*\} 1\.0', await resp.text()
        )


async def test_a_decode_without_a_reachable_bootstrap_server_fails_its_handshake(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    decode = await emulator(*DECODE)
    (closed,) = free_ports(1)
    body = {"text": "nobody there", "bootstrap_host": LOOP, "bootstrap_port": closed, "bootstrap_room": 3}
    status, err = await post(http, decode.url + "/generate", body)
    assert status == 500 and err["message"].startswith("Decode handshake failed for request rank=0")
    assert err["message"].endswith(
        f"Could not fetch prefill parallel info from bootstrap_addr: {LOOP}:{closed}"
    )


async def test_an_aborted_prefill_request_fails_its_decode(
    pair: tuple[Emu, Emu], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    rooms = prefill.app[PD_ROLE].rooms
    assert rooms is not None
    body = {"text": "the router gives up", "sampling_params": {"max_new_tokens": 3}} | fields(prefill, 8)
    waiting = asyncio.create_task(post(http, prefill.url + "/generate", body))
    await wait_for(lambda: 8 in rooms.rooms and rooms.rooms[8].claimed)
    waiting.cancel()  # the client (the router) closes the prefill connection
    await wait_for(lambda: rooms.rooms[8].outcome.done())
    status, err = await post(http, decode.url + "/generate", body)
    assert status == 500 and err["message"].startswith("Decode transfer failed for request rank=0")
    assert err["message"].endswith("KVTransferError(bootstrap_room=8): Aborted by AbortReq.")


async def test_a_decode_that_leaves_fails_the_prefills_transfer(
    emulator: StartEmu, http: aiohttp.ClientSession
) -> None:
    prefill = await emulator(*PREFILL, "--emu-kv-transfer-gb-s", "0.0001")  # 1,000 tokens: 1.6 s real
    decode = await emulator(*DECODE)
    body = {"input_ids": list(range(1000)), "sampling_params": {"max_new_tokens": 2}} | fields(prefill, 4)
    leaving = asyncio.create_task(post(http, decode.url + "/generate", body))
    sending = asyncio.create_task(post(http, prefill.url + "/generate", body))
    await wait_for(lambda: prefill.replica.pd.inflight_reqs == 1)  # the prefill is sending the KV
    leaving.cancel()  # the router drops the decode connection
    status, err = await sending
    assert status == 500 and err["message"].startswith("Prefill transfer failed for request rank=0 req.rid=")
    assert (
        "KVTransferError(bootstrap_room=4): Decode instance could be dead, remote mooncake session"
        in err["message"]
    )
    assert prefill.replica.pd.transfer_failed == 1


async def test_a_request_without_a_room_is_refused(
    pair: tuple[Emu, Emu], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    message = "Invalid request: Disaggregated request received without bootstrap room id. req.rid="
    status, err = await post(http, decode.url + "/v1/chat/completions", {"messages": CHAT})
    assert (status, err["type"], err["code"]) == (400, "BadRequestError", 400) and err["message"].startswith(
        message
    )
    status, err = await post(http, prefill.url + "/generate", {"text": "x", "rid": "r1"})
    assert (status, err) == (400, {"error": {"message": message + "r1"}})
    status, events = await sse(http, decode.url + "/v1/chat/completions", {"messages": CHAT, "stream": True})
    assert status == 200 and events[0]["error"]["code"] == 400 and events[-1] == "[DONE]"
    status, err = await post(http, decode.url + "/generate", {"text": "x", "bootstrap_room": "nine"})
    assert status == 400 and "bootstrap_room" in err["error"]["message"]
    fake = {"text": "health-style probe", "bootstrap_host": "2.2.2.2", "bootstrap_room": 0}
    assert (
        (await post(http, prefill.url + "/generate", fake))[0]
        == (await post(http, decode.url + "/generate", fake))[0]
        == 200
    )


# ---- reports -------------------------------------------------------------------------------------
async def test_pd_servers_report_their_mode_queues_and_load(
    pair: tuple[Emu, Emu], http: aiohttp.ClientSession
) -> None:
    prefill, decode = pair
    for emu, mode, method in (
        (prefill, "prefill", "follow_bootstrap_room"),
        (decode, "decode", "round_robin"),
    ):
        async with http.get(emu.url + "/health") as resp:
            assert resp.status == 200  # healthy without a peer
        async with http.get(emu.url + "/get_server_info") as resp:
            info = await resp.json()
        assert (info["disaggregation_mode"], info["load_balance_method"]) == (mode, method)
        assert info["disable_radix_cache"] is (mode == "decode")
        async with http.get(emu.url + "/metrics") as resp:
            assert f'sglang:num_decode_transfer_queue_reqs{{engine_type="{mode}"' in await resp.text()
    async with http.get(prefill.url + "/server_info") as resp:
        assert (await resp.json())["disaggregation_bootstrap_port"] == prefill.replica.pd.bootstrap_port > 0
    ids = list(range(1000, 1300))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}} | fields(prefill, 31)
    held = asyncio.create_task(post(http, prefill.url + "/generate", body))

    async def queued() -> bool:  # the prompt waits in the bootstrap queue, counted by /get_load
        async with http.get(prefill.url + "/get_load") as resp:
            load = (await resp.json())[0]
        async with http.get(prefill.url + "/v1/loads", params={"include": "disagg"}) as resp:
            section = (await resp.json())["loads"][0]["disaggregation"]
        return bool(load["num_tokens"] >= len(ids) and section["prefill_prealloc_queue_reqs"] == 1)

    await wait_for(queued)
    status, _ = await post(http, decode.url + "/generate", body)
    assert status == 200 and (await held)[0] == 200


# ---- sglang-router 0.3.2 -------------------------------------------------------------------------
@pytest.fixture
async def router(pair: tuple[Emu, Emu], tmp_path: Path) -> AsyncIterator[str]:
    """sglang-router in PD mode over the pair (its default policy), ready when both workers are healthy."""
    prefill, decode = pair
    (port, metrics) = free_ports(2)
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", LOOP, "--port", str(port)]
    argv += [
        "--pd-disaggregation",
        "--prefill",
        prefill.url,
        str(prefill.replica.pd.bootstrap_port),
        "--decode",
        decode.url,
    ]
    argv += ["--log-level", "warn", "--prometheus-host", LOOP, "--prometheus-port", str(metrics)]
    url = f"http://{LOOP}:{port}"
    ready = counts("healthy_workers", 2)
    async with ManagedProcess(argv, [url], tmp_path / "router.log", SGLANG_ENV, 60.0, "/readiness", ready):
        yield url


@pytest.mark.slow
async def test_sglang_router_pd_mode_routes_a_pair_unchanged(router: str, pair: tuple[Emu, Emu]) -> None:
    prefill, decode = pair
    before = [await emu.served() for emu in pair]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "route me to a prefill and a decode " * 4}
    ]
    async with AsyncOpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0) as client:
        chat = await client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        assert (
            chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 5
        )
        text, usage = await streamed_chat(client, messages, 5)
        assert text == chat.choices[0].message.content and usage is not None and usage.completion_tokens == 5
        details = usage.prompt_tokens_details
        assert details is not None and details.cached_tokens  # the repeated prompt hit the prefill's cache
    assert [await emu.served() - b for emu, b in zip(pair, before, strict=True)] == [2, 2]
    assert len(await prefill.generations()) == len(await decode.generations()) == 2
    assert prefill.replica.pd.last_speed_gb_s == pytest.approx(20.0)  # the KV went by the modelled transfer
