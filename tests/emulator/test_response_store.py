"""--enable-response-store (responses-contract §1.5, §1.7): off by default (SGLang's 400s); on, responses
are kept in the replica's memory: GET, chains through previous_response_id, background, cancel, and a
restart that loses them all."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.conftest import wait_for
from tests.emulator.conftest import Emu, StartEmu

FAST = ("--emu-time-scale", "0.001")
STORE = ("--enable-response-store",)
MODEL = "kvroute-emu"
DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a standalone server; "
    "response storage is unavailable in PD mode."
)


async def _call(emu: Emu, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    async with emu.http.request(method, emu.url + path, json=body) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _create(emu: Emu, **body: Any) -> dict[str, Any]:
    status, out = await _call(emu, "POST", "/v1/responses", {"model": MODEL, **body})
    assert status == 200, out
    result: dict[str, Any] = out
    return result


def _disabled(param: str) -> dict[str, Any]:
    return {"error": {"message": DISABLED, "type": "invalid_request_error", "param": param, "code": 400}}


async def test_off_by_default_the_stateful_parts_are_400s(emulator: StartEmu) -> None:
    emu = await emulator(*FAST)
    out = await _create(emu, input="keep this", max_output_tokens=4)
    assert out["store"] is True  # served, echoed, not kept
    assert await _call(emu, "GET", f"/v1/responses/{out['id']}") == (400, _disabled("response_id"))
    assert await _call(emu, "POST", f"/v1/responses/{out['id']}/cancel") == (400, _disabled("response_id"))
    body = {"model": MODEL, "input": "again", "previous_response_id": out["id"]}
    assert await _call(emu, "POST", "/v1/responses", body) == (400, _disabled("previous_response_id"))


async def test_stored_responses_chain_and_are_retrieved(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, *STORE)
    first = await _create(
        emu, input="the first question about caches", instructions="Be brief.", max_output_tokens=9
    )
    assert await _call(emu, "GET", f"/v1/responses/{first['id']}") == (200, first)
    second = await _create(
        emu, input="and the second one", previous_response_id=first["id"], max_output_tokens=5
    )
    assert second["previous_response_id"] == first["id"] and second["instructions"] is None
    used = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    # the chain's input and output come first; the first turn's instructions are not inherited
    assert second["usage"]["input_tokens"] > first["usage"]["output_tokens"]
    assert second["usage"]["input_tokens_details"]["cached_tokens"] < used  # no system turn any more
    same = [{"role": "user", "content": "the first question about caches"}, *first["output"]]
    explicit = await _create(
        emu, input=[*same, {"role": "user", "content": "and the second one"}], max_output_tokens=5
    )
    assert explicit["usage"]["input_tokens"] == second["usage"]["input_tokens"]
    assert explicit["usage"]["input_tokens_details"]["cached_tokens"] == explicit["usage"]["input_tokens"] - 1
    third = await _create(emu, input="third", previous_response_id=second["id"], max_output_tokens=4)
    assert third["usage"]["input_tokens"] > explicit["usage"]["input_tokens"]  # the whole chain
    second_used = second["usage"]["input_tokens"] + second["usage"]["output_tokens"]
    assert third["usage"]["input_tokens_details"]["cached_tokens"] == second_used


async def test_unknown_ids_and_store_false(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, *STORE)
    kept_out = await _create(emu, input="not kept", store=False, max_output_tokens=3)
    status, err = await _call(emu, "GET", f"/v1/responses/{kept_out['id']}")
    assert status == 404 and err["error"] == {
        "message": f"Response with id '{kept_out['id']}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    status, err = await _call(emu, "GET", "/v1/responses/abc")
    assert (
        status == 400
        and err["error"]["message"] == "Invalid 'response_id': 'abc'. Expected an ID that begins with 'resp'."
    )
    status, err = await _call(
        emu, "POST", "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_0"}
    )
    assert status == 404 and err["error"]["param"] == "response_id"
    status, err = await _call(
        emu, "POST", "/v1/responses", {"model": MODEL, "input": "x", "background": True, "store": False}
    )
    assert (
        status == 400
        and err["error"]["message"] == "background=true requires store=true."
        and err["error"]["param"] == "store"
    )


async def test_background_runs_queued_then_completes(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, *STORE)
    queued = await _create(emu, input="work on this in the background", background=True, max_output_tokens=7)
    assert queued["status"] == "queued" and queued["output"] == [] and queued["usage"] is None

    async def ended() -> bool:
        status = (await _call(emu, "GET", f"/v1/responses/{queued['id']}"))[1]["status"]
        return status not in ("queued", "in_progress")

    await wait_for(ended)
    _, done = await _call(emu, "GET", f"/v1/responses/{queued['id']}")
    assert done["status"] == "incomplete" and done["output"][0]["type"] == "message"
    assert done["usage"]["output_tokens"] == 5 and done["id"] == queued["id"]
    assert await _call(emu, "POST", f"/v1/responses/{queued['id']}/cancel") == (
        200,
        done,
    )  # terminal: unchanged


async def test_cancel_an_in_flight_background_response(emulator: StartEmu) -> None:
    emu = await emulator("--emu-time-scale", "1", "--emu-debug", *STORE)
    queued = await _create(emu, input="a long answer please", background=True, max_output_tokens=4002)

    async def decoding() -> bool:
        state = (await emu.state())["queue"]
        return bool(state["running"])

    await wait_for(decoding)
    assert (await _call(emu, "GET", f"/v1/responses/{queued['id']}"))[1]["status"] == "in_progress"
    status, cancelled = await _call(emu, "POST", f"/v1/responses/{queued['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled" and cancelled["output"] == []
    state = await emu.state()
    assert state["aborted_total"] == 1 and state["queue"]["running"] == 0  # the engine request was aborted
    assert (await _call(emu, "GET", f"/v1/responses/{queued['id']}"))[1]["status"] == "cancelled"


async def test_an_answer_in_flight_is_not_found_until_it_ends(emulator: StartEmu) -> None:
    emu = await emulator("--emu-time-scale", "0.05", "--emu-debug", *STORE)
    body = {"model": MODEL, "input": "slow", "max_output_tokens": 302, "request_id": "resp_slow"}
    task = asyncio.create_task(_call(emu, "POST", "/v1/responses", body))

    async def running() -> bool:
        return bool((await emu.state())["queue"]["running"])

    await wait_for(running)
    assert (await _call(emu, "GET", "/v1/responses/resp_slow"))[0] == 404
    status, done = await task
    assert status == 200 and await _call(emu, "GET", "/v1/responses/resp_slow") == (200, done)


async def test_a_restart_loses_the_store(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, *STORE, "--emu-enable-faults")
    out = await _create(emu, input="remember me", max_output_tokens=4)
    assert (await _call(emu, "GET", f"/v1/responses/{out['id']}"))[0] == 200
    await emu.fault(action="restart")
    assert (await _call(emu, "GET", f"/v1/responses/{out['id']}"))[0] == 404
    status, _ = await _call(
        emu, "POST", "/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": out["id"]}
    )
    assert status == 404


async def test_a_streamed_response_is_stored_when_it_ends(emulator: StartEmu) -> None:
    emu = await emulator(*FAST, *STORE)
    body = {"model": MODEL, "input": "stream and keep", "stream": True, "max_output_tokens": 6}
    async with emu.http.post(f"{emu.url}/v1/responses", json=body) as resp:
        frames = (await resp.read()).decode().strip().split("\n\n")
    final = orjson.loads(frames[-1].split("data: ", 1)[1])["response"]
    assert await _call(emu, "GET", f"/v1/responses/{final['id']}") == (200, final)
    follow = await _create(emu, input="next", previous_response_id=final["id"], max_output_tokens=3)
    assert follow["usage"]["input_tokens_details"]["cached_tokens"] > 0
