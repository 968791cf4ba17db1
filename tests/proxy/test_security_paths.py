"""The security review replayed on paths: every path trick x every replica control endpoint x no key,
a client key and the admin key, sent byte for byte to a gateway with API keys and an admin key. What
arrives at a recording replica is asserted, not only the status: nothing but what the gateway meant
to send (docs/security.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.conftest import Emulators, StartGateway
from tests.proxy.conftest import ADMIN, EMU_FLAGS, MODEL
from tests.proxy.recorder import CONTROL_PATHS, Recorder, raw_request

CLIENT_KEY = "sk-tenant-a"
KEYS = [{"key": CLIENT_KEY, "tenant": "acme"}, {"key": "sk-plain"}]
WHO = {"no key": {}, "client key": {"Authorization": f"Bearer {CLIENT_KEY}"}, "admin key": ADMIN}
JSON = {"Content-Type": "application/json"}

# ways to write a path that a client library or a server would resolve to /<X> (X: a control path
# without its leading slash), from under a /v1 route or an exempted prefix
TRICKS = (
    "/v1/warmup/../../{x}",
    "/v1/../{x}",
    "/v1/%2e%2e/{x}",
    "/v1/%2E%2E/{x}",
    "/v1/.%2e/{x}",
    "/v1/./../{x}",
    "/v1/chat/completions/../../{x}",
    "/v1/%2e%2e%2f{x}",
    "/v1/..%2f{x}",
    "/v1/..%5c{x}",
    "/v1//../{x}",
    "/generate/../{x}",
    "/admin/../{x}",
    "/v1/warmup/%2e%2e/%2e%2e/{x}",
)


@dataclass
class Fleet:
    url: str
    recorders: list[Recorder]

    def arrived(self) -> list[str]:
        return [s.target for r in self.recorders for s in r.client_requests()]


@pytest.fixture
async def fleet(emulator_server: Emulators, gateway: StartGateway, tmp_path: Path) -> AsyncIterator[Fleet]:
    keys = tmp_path / "keys.jsonl"
    keys.write_text("\n".join(orjson.dumps(k).decode() for k in KEYS))
    async with AsyncExitStack() as exits:
        recorders = [Recorder((await emulator_server(*EMU_FLAGS)).url) for _ in range(2)]
        urls = [await exits.enter_async_context(r.running()) for r in recorders]
        gw = await gateway(
            urls, health_interval=0.1, policy="round_robin", admin_key=ADMIN["Authorization"][7:],
            api_keys=str(keys),
        )  # fmt: skip
        yield Fleet(gw.url, recorders)


async def test_no_path_trick_reaches_a_control_endpoint(fleet: Fleet) -> None:
    """14 tricks x 19 control endpoints x 3 keys: every one a 400 before routing, nothing arrives."""
    answered: dict[int, int] = {}
    for trick in TRICKS:
        for control in CONTROL_PATHS:
            for headers in WHO.values():
                target = trick.format(x=control.lstrip("/"))
                status, _ = await raw_request(fleet.url, "POST", target, headers | JSON, b"{}")
                answered[status] = answered.get(status, 0) + 1
    assert fleet.arrived() == []
    assert answered == {400: len(TRICKS) * len(CONTROL_PATHS) * len(WHO)}


@pytest.mark.parametrize(
    "target",
    ["/v1/warmup/../chat/completions", "/v1/./chat/completions", "/v1/%2e/chat/completions"],
)
async def test_no_path_trick_reaches_generation(fleet: Fleet, target: str) -> None:
    """The review's key bypass and tenant escape: a completion without a key, or outside the salt."""
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    for headers in WHO.values():
        status, answer = await raw_request(fleet.url, "POST", target, headers | JSON, body)
        assert status == 400, answer
        assert orjson.loads(answer)["error"]["code"] == "invalid_path"
    assert fleet.arrived() == []


@pytest.mark.parametrize("control", CONTROL_PATHS)
async def test_control_endpoints_are_not_gateway_routes(fleet: Fleet, control: str) -> None:
    """Straight to /<control> or /v1/<control>: the gateway has no such route for a client key, and
    its admin key does not turn the passthrough into one (its own POST /flush_cache is the admin API's,
    tested in test_replica_control.py)."""
    for who, headers in WHO.items():
        for target in (control, "/v1" + control):
            if (who, target) == ("admin key", "/flush_cache"):
                continue
            status, _ = await raw_request(fleet.url, "POST", target, headers | JSON, b"{}")
            assert status in (401, 403, 404, 405), (target, status)
    assert fleet.arrived() == []


async def test_prefixes_match_on_whole_segments(fleet: Fleet) -> None:
    """/v1/warmupX is not /v1/warmup: a client route, so a key is needed, and not on the allowlist."""
    status, _ = await raw_request(fleet.url, "POST", "/v1/warmupX", JSON, b"{}")
    assert status == 401
    status, _ = await raw_request(fleet.url, "POST", "/v1/warmupX", WHO["client key"] | JSON, b"{}")
    assert status == 404
    assert fleet.arrived() == []


@pytest.mark.parametrize(
    "target",
    ["/v1/chat//completions", "/v1/chat/completions/", "/v1/%00/x", "/v1/x%0aFORGED", "/v1/%ff"],
)
async def test_empty_segments_and_control_bytes_are_400(fleet: Fleet, target: str) -> None:
    status, answer = await raw_request(fleet.url, "POST", target, WHO["client key"] | JSON, b"{}")
    assert status == 400, answer
    assert fleet.arrived() == []
