"""The fleet knows the two roles: from the settings and from /server_info, in health, drain, the circuit
breakers, warm-ups, shared state, /status and /metrics; mixed fleets are refused (settings) or left idle
(found at run time)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config.settings import SettingsError, load_settings
from proxy.disagg.bootstrap import batch_size, bootstrap_host
from proxy.fleet.fleet import Fleet
from proxy.fleet.replica_info import parse_replica_info
from proxy.fleet.restarts import Restarts
from proxy.fleet.roles import FAKE_BOOTSTRAP, role_of, with_fields
from proxy.front.openai import parse_request
from proxy.types import Route
from tests.conftest import MODEL, Emulators, StartGateway, wait_for
from tests.proxy.conftest import ADMIN, EMU_FLAGS, SYSTEM
from tests.proxy.disagg.conftest import DECODE_FLAGS, PREFILL_FLAGS, PdFactory
from tests.proxy.warm.test_warmup import document, warm
from tests.redis_server import RedisServer

JSON = {"Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [SYSTEM, {"role": "user", "content": "What is a role?"}]}


async def chat(url: str, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    body = CHAT | {"max_tokens": 4} | extra
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, dict(r.headers), await r.read()


# ---- pure parts ----------------------------------------------------------------------------------
def test_a_role_is_what_the_server_reports_and_a_contradiction_is_named() -> None:
    assert role_of(None, "prefill") == ("prefill", None)
    assert role_of(None, "null") == ("unified", None)
    assert role_of("decode", None) == ("decode", None)  # a server that says nothing: as declared
    role, why = role_of("prefill", "decode")
    assert (
        role == "prefill"
        and why == "declared a prefill server (--prefill) but reports disaggregation_mode decode"
    )
    info = parse_replica_info({"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998}, {})
    assert (info.disaggregation_mode, info.bootstrap_port) == ("prefill", 8998)


def test_bootstrap_fields_are_spliced_in_front_of_the_clients_bytes_or_replace_its_own() -> None:
    raw = b'  {"model": "m",\n "prompt": "x"}'
    out = with_fields(raw, orjson.loads(raw), {"bootstrap_room": 2**63 - 1})
    assert out == b'  {"bootstrap_room":9223372036854775807,"model": "m",\n "prompt": "x"}'
    assert orjson.loads(with_fields(b"{}", {}, FAKE_BOOTSTRAP)) == {
        "bootstrap_host": "2.2.2.2",
        "bootstrap_room": 0,
    }
    own = {"prompt": "x", "bootstrap_room": 5, "bootstrap_host": "evil"}
    assert orjson.loads(
        with_fields(orjson.dumps(own), own, {"bootstrap_room": 9, "bootstrap_host": "h"})
    ) == {
        "prompt": "x",
        "bootstrap_room": 9,
        "bootstrap_host": "h",
    }
    assert bootstrap_host("http://u:p@[::1]:30000") == "[::1]" and bootstrap_host("http://p0:30000") == "p0"


@pytest.mark.parametrize(
    ("route", "body", "size"),
    [
        (Route.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}, 3),
        (Route.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 1}, None),
        (Route.COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}, 2),
        (Route.COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, None),
        (Route.GENERATE, {"input_ids": [[1, 2], [3]]}, 2),
        (Route.GENERATE, {"text": ["a", "b"]}, None),  # SGLang expands a scalar room to room + i
    ],
)
def test_batches_are_found_where_sglang_router_finds_them(
    route: Route, body: dict[str, Any], size: int | None
) -> None:
    assert batch_size(parse_request(route, orjson.dumps(body), None, None)) == size


# ---- settings ------------------------------------------------------------------------------------
def test_pd_settings_from_flags_toml_and_environment(tmp_path: Any) -> None:
    st = load_settings(
        ["--prefill", "http://p0:30000,http://p1:30000", "--decode", "http://d0:30000"], env={}
    )
    assert st.prefill == ("http://p0:30000", "http://p1:30000") and st.bootstrap_port_of(1) is None
    st = load_settings(
        [
            *("--prefill", "http://p0:30000", "--prefill-bootstrap-port", "9001"),
            *("--prefill", "http://p1:30000", "--prefill-bootstrap-port", "9002"),
        ],
        env={"KVROUTE_DECODE": "http://d0:30000 http://d1:30000"},
    )
    assert (st.bootstrap_port_of(0), st.bootstrap_port_of(1), len(st.decode)) == (9001, 9002, 2)
    toml = tmp_path / "pd.toml"
    toml.write_text(
        'prefill = ["http://p0:30000"]\nprefill_bootstrap_port = 8998\ndecode = ["http://d0:30000"]\n'
    )
    st = load_settings(["--config", str(toml)], env={})
    assert st.bootstrap_port_of(0) == 8998 and st.decode == ("http://d0:30000",)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "http://a:1", "--prefill", "http://p:1", "--decode", "http://d:1"], "cannot be mixed"),
        (["--prefill", "http://p:1"], "setting 'prefill' needs 'decode'"),
        (["--decode", "http://d:1"], "setting 'decode' needs 'prefill'"),
        (
            [
                "--prefill",
                "http://p:1,http://q:1,http://r:1",
                "--decode",
                "http://d:1",
                "--prefill-bootstrap-port",
                "1,2",
            ],
            "2 ports for 3 prefill servers",
        ),
        (
            ["--prefill", "http://p:1", "--decode", "http://d:1", "--prefill-bootstrap-port", "0"],
            "[1, 65535]",
        ),
    ],
)
def test_bad_pd_settings_are_refused_with_the_reason(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings(argv, env={})


# ---- roles at run time ---------------------------------------------------------------------------
async def test_roles_come_from_server_info_and_a_mixed_fleet_leaves_unified_replicas_idle(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    p = await emulator_server(*PREFILL_FLAGS)
    d = await emulator_server(*DECODE_FLAGS)
    unified = await emulator_server(*EMU_FLAGS)
    gw = await gateway([p.url, d.url, unified.url], health_interval=0.1, admin_key="k", public_status=True)
    for _ in range(3):
        status, headers, _ = await chat(gw.url)
        assert status == 200 and (headers["x-kvroute-prefill"], headers["x-kvroute-replica"]) == (
            p.url,
            d.url,
        )
    assert await unified.generations() == []
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/status") as r:
        doc = await r.json()
    assert {r["id"]: r["role"] for r in doc["replicas"]} == {
        p.url: "prefill",
        d.url: "decode",
        unified.url: "unified",
    }
    assert doc["pd"]["idle_unified"] == [unified.url] and doc["pd"]["disaggregated"] is True
    assert doc["pd"]["prefill"][0]["bootstrap_port"] == p.replica.pd.bootstrap_port
    text = gw.metrics()
    for role in ("prefill", "decode", "unified"):
        assert f'kvroute_pd_replicas{{role="{role}"}} 1' in text


async def test_a_server_whose_mode_contradicts_its_declared_role_is_kept_out(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1)
    gw = fleet.gw.gw
    gw.fleet.add(fleet.prefills[0].url, "decode")  # the prefill server, now declared a decode
    replica = gw.fleet.get(fleet.prefills[0].url)
    assert replica is not None
    await wait_for(lambda: not replica.healthy)
    assert replica.last_error == "declared a decode server (--decode) but reports disaggregation_mode prefill"


async def test_a_draining_decode_gets_no_new_pairs(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=2, seed=3)
    async with aiohttp.ClientSession() as http:
        body = {"url": fleet.decodes[0].url}
        async with http.post(fleet.url + "/admin/replicas/drain", json=body, headers=ADMIN) as r:
            assert r.status == 200
    for i in range(6):
        status, headers, _ = await chat(fleet.url, seed=i)
        assert status == 200 and headers["x-kvroute-replica"] == fleet.decodes[1].url
    assert await fleet.decodes[0].generations() == []


def test_a_breaker_ejects_at_most_half_of_the_servers_of_its_role() -> None:
    fleet = Fleet([], 1.0, lambda r: None, Restarts(lambda r: None, lambda r, why: None, lambda r: False))
    for name, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")):
        r = fleet.add(f"http://{name}:1", role)  # type: ignore[arg-type]
        r.healthy = True
    for _ in range(10):
        for name in ("d0", "d1"):
            fleet.outcome(f"http://{name}:1", False, "boom")
    open_ = [r.id for r in fleet.replicas() if not fleet.admits(r.id)]
    assert open_ == ["http://d0:1"]  # one decode out of two; the other stays, and no prefill is touched


async def test_warm_ups_go_to_prefill_servers_only_with_the_fake_transfer(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1, taps=True)
    doc = {"id": "doc", "messages": [{"role": "system", "content": document(1, 800)}]}
    status, job = await warm(fleet.url, {"model": MODEL, "documents": [doc], "wait": True})
    assert status == 200 and job["status"] == "done"
    assert fleet.taps["d0"].bodies == []
    (step,) = [orjson.loads(b) for b in fleet.taps["p0"].bodies]
    assert (step["bootstrap_host"], step["bootstrap_room"]) == ("2.2.2.2", 0)
    status, _, body = await chat(fleet.url, messages=[doc["messages"][0], {"role": "user", "content": "q"}])
    cached = orjson.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert status == 200 and cached > 700  # the first real question hits the warmed prefill


async def test_gateways_sharing_redis_see_each_others_decode_load(
    pd_fleet: PdFactory, gateway: StartGateway, redis_server: RedisServer
) -> None:
    """Gateway A holds a request on decode d0 (d0 hangs it; A was told to drain d1); gateway B, sharing
    A's load through Redis, sends its next pair to d1."""
    fleet = await pd_fleet(prefills=1, decodes=2, state=redis_server.url)
    b = await gateway(
        [], prefill=(fleet.urls["p0"],), decode=(fleet.urls["d0"], fleet.urls["d1"]), health_interval=0.1,
        state=redis_server.url,
    )  # fmt: skip
    a = fleet.gw.gw
    a.fleet.drain(fleet.urls["d1"], True)
    await fleet.decodes[0].fault(action="hang", count=1)
    held = asyncio.create_task(chat(fleet.url, max_tokens=64))
    d0 = b.gw.fleet.get(fleet.urls["d0"])
    assert d0 is not None
    await wait_for(lambda: d0.remote is not None and d0.remote.inflight_requests == 1)
    for i in range(4):
        status, headers, _ = await chat(b.url, max_tokens=64, seed=i)
        assert status == 200 and headers["x-kvroute-replica"] == fleet.urls["d1"]
    held.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await held


async def test_the_gateway_is_ready_only_with_a_healthy_server_of_each_role(pd_fleet: PdFactory) -> None:
    fleet = await pd_fleet(prefills=1, decodes=1)

    async def ready() -> int:
        async with aiohttp.ClientSession() as http, http.get(fleet.url + "/ready") as r:
            return r.status

    assert await ready() == 200
    await fleet.decodes[0].fault(action="unhealthy")  # /health answers 503 until cleared
    decode = fleet.gw.gw.fleet.get(fleet.decodes[0].url)
    assert decode is not None
    await wait_for(lambda: not decode.healthy)
    assert await ready() == 503  # the prefill server alone cannot serve a request
    status, _, body = await chat(fleet.url)
    assert status == 503 and b"no healthy decode server" in body
