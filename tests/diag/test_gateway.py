"""`kvroute probe` and `kvroute ab` through a real kvroute gateway in front of two emulated replicas.

The probe detects the gateway from /status, sizes the pressure from R's replica's pools as /status lists
them, keeps the pressure on R's replica through session affinity (counted by x-kvroute-replica), and
leaves the re-sends to the gateway's own routing: kvroute's cost policy must send R back to the replica
whose host pool holds it.
"""

from __future__ import annotations

from diag import report
from diag.ab import ab
from diag.ab import parser as ab_parser
from diag.client import SGLangClient
from diag.probe import ProbeOptions, probe
from diag.progress import Progress
from diag.target import discover
from diag.verdict import WORKS
from tests.conftest import Emulators, StartGateway

FLAGS = (
    "--max-total-tokens", "48000", "--page-size", "1", "--enable-metrics", "--enable-cache-report",
    "--enable-hierarchical-cache", "--hicache-write-policy", "write_back", "--emu-time-scale", "0.05",
)  # fmt: skip
R = 40_000


async def test_probe_through_the_gateway(emulator_server: Emulators, gateway: StartGateway) -> None:
    replicas = [await emulator_server(*FLAGS), await emulator_server(*FLAGS)]
    gw = await gateway([e.url for e in replicas])
    result = await probe(gw.url, ProbeOptions(R, seed=21, timeout_s=60), Progress("t", enabled=False))
    assert result.target.gateway and {p.replica for p in result.target.pools} == {e.url for e in replicas}
    home = result.pool.replica
    assert result.cold.replica == result.after.replica == result.again.replica == home
    assert result.pressure.get(home, 0) >= result.plan.target_tokens  # the pressure reached R's replica
    assert result.plan.high is not None and result.pressure[home] <= result.plan.high
    assert result.verdict.outcome == WORKS and (result.after.host or 0) >= R - 1
    assert result.host_used[1] is not None and result.host_used[1] >= R  # read from the replica itself
    text = report.probe_text(result)
    assert "kvroute gateway" in text and f"R's replica: {home}" in text and text.count(home) >= 5


async def test_discover_lists_the_gateway_replicas_pools(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    emu = await emulator_server(*FLAGS)
    gw = await gateway([emu.url])
    async with SGLangClient(gw.url) as client:
        target = await discover(client)
    async with SGLangClient(emu.url) as client:
        direct = await discover(client)
    assert target.gateway and not direct.gateway
    (via_gateway,) = target.pools
    (pool,) = direct.pools
    assert (
        (via_gateway.gpu_tokens, via_gateway.host_tokens)
        == (pool.gpu_tokens, pool.host_tokens)
        == (48_000, 96_001)
    )
    assert via_gateway.write_policy == pool.write_policy == "write_back"


async def test_ab_through_the_gateway(emulator_server: Emulators, gateway: StartGateway) -> None:
    replicas = [await emulator_server(*FLAGS), await emulator_server(*FLAGS)]
    gw = await gateway([e.url for e in replicas], admin_key="k")  # a gateway flushes for its admin only
    argv = [gw.url, "--context-tokens", "20000", "--runs", "2", "--seed", "8", "--api-key", "k"]
    args = ab_parser().parse_args(argv)
    (result,) = await ab(args, Progress("t", enabled=False))
    assert result.target.gateway and result.notes == ()  # the gateway's fan-out flush emptied the cache
    assert result.cold.last.cached_tokens == 0 and result.hot.last.device == 20_000 - 1
    assert result.hot.last.replica == result.cold.last.replica  # kvroute sent the hot run to its cache


async def test_a_gateway_that_names_no_replica_is_reported(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    emu = await emulator_server(*FLAGS)
    gw = await gateway([emu.url], no_request_id_headers=True)
    result = await probe(gw.url, ProbeOptions(R, seed=22, timeout_s=60), Progress("t", enabled=False))
    assert result.cold.replica is None and result.verdict.outcome == WORKS  # one replica: attribution holds
    assert "the gateway names no replica" in report.probe_text(result)
