"""DNS discovery (proxy/fleet/discovery.py) against a real DNS server on loopback (tests/dnsserver.py) and
real emulated replicas: records become replicas that serve, a replica that leaves is drained and removed after
its last request (or at the bound), one that comes back is undrained, failed lookups keep the last known
set and are logged once, NXDOMAIN empties it, SRV gives named replicas, resolution never holds a request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import SettingsError, load_settings
from proxy.config.targets import Target, parse_dns_server, parse_target
from proxy.fleet.discovery import DISCOVERY, Discovery, DnsResolver
from tests.conftest import Emulators, Gw, StartGateway, wait_for
from tests.dnsserver import DnsServer
from tests.proxy.conftest import EMU_FLAGS, MODEL

NAME = "sglang.kv.test"
HOSTS = ("127.0.0.2", "127.0.0.3")
FAST = {"discover_interval": 0.1, "health_interval": 0.2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def shared_port(hosts: tuple[str, ...]) -> int:
    """A TCP port free on every one of ``hosts`` right now (A records carry no port: all share one)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((hosts[0], 0))
            port = int(first.getsockname()[1])
            others = [socket.socket() for _ in hosts[1:]]
            try:
                for s, host in zip(others, hosts[1:], strict=True):
                    s.bind((host, port))
                return port
            except OSError:
                continue
            finally:
                for s in others:
                    s.close()
    raise RuntimeError("no port free on all hosts")


@pytest.fixture
def dns_server() -> Iterator[DnsServer]:
    with DnsServer() as server:
        yield server


async def fleet_of(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer, n: int = 2, **settings: Any
) -> tuple[Gw, list[str]]:
    port = shared_port(HOSTS)
    emus = [await emulator_server(*EMU_FLAGS, port=port, host=h) for h in HOSTS[:n]]
    dns_server.set(NAME, "A", *HOSTS[:n])
    target = f"dns://{NAME}:{port}"
    gw = await gateway([], discover=(target,), dns_server=dns_server.address, **(FAST | settings))
    return gw, [e.url for e in emus]


def discovery(gw: Gw) -> Discovery:
    return gw.app[DISCOVERY]


def members(gw: Gw) -> dict[str, bool]:
    """Replica -> draining."""
    return {r.id: r.draining for r in gw.gw.fleet.replicas()}


async def chat(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=CHAT) as r:
        await r.read()
        return r.status, r.headers.get("x-kvroute-replica", "")


async def test_a_records_become_replicas_that_serve_from_the_start(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, urls = await fleet_of(emulator_server, gateway, dns_server)
    assert members(gw) == dict.fromkeys(urls, False)  # resolved and checked before the first request
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/ready") as r:
        assert r.status == 200 and (await r.json())["healthy_replicas"] == 2
    served = {(await chat(gw.url))[1] for _ in range(4)}
    assert served <= set(urls) and served


async def test_a_replica_that_leaves_is_drained_then_removed_after_its_last_request(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, (a, b) = await fleet_of(emulator_server, gateway, dns_server, policy="round_robin")
    for url in (a, b):
        async with aiohttp.ClientSession() as s:
            await s.post(url + "/_emu/faults", json={"action": "hang", "count": 1})
    pending = [asyncio.ensure_future(chat(gw.url)) for _ in range(2)]  # one hangs on each replica
    await wait_for(lambda: all(r.inflight_requests == 1 for r in gw.gw.fleet.replicas()))
    dns_server.set(NAME, "A", HOSTS[0])
    await wait_for(lambda: members(gw) == {a: False, b: True})
    for _ in range(3):  # new requests go to the replica still listed
        assert await chat(gw.url) == (200, a)
    await asyncio.sleep(1.5)  # sweeps run: the draining replica still has its request
    assert b in members(gw)
    replica_b = gw.gw.fleet.get(b)
    assert replica_b is not None
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await wait_for(lambda: replica_b.inflight_requests == 0)
    await wait_for(lambda: members(gw) == {a: False}, timeout_s=3.0)
    assert not discovery(gw).draining and discovery(gw).owned == {a}


async def test_a_draining_replica_is_removed_at_the_bound_with_a_request_still_in_flight(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, (a,) = await fleet_of(emulator_server, gateway, dns_server, n=1, discover_drain_timeout=0.3)
    async with aiohttp.ClientSession() as s:
        await s.post(a + "/_emu/faults", json={"action": "hang", "count": 1})
    pending = asyncio.ensure_future(chat(gw.url))
    replica = gw.gw.fleet.get(a)
    assert replica is not None
    await wait_for(lambda: replica.inflight_requests == 1)
    dns_server.clear(NAME)
    dns_server.set(NAME, "TXT", '"no replicas"')  # the name exists, without A records
    await wait_for(lambda: members(gw) == {}, timeout_s=3.0)
    assert replica.inflight_requests == 1  # removed anyway: the bound is up
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)


async def test_a_replica_back_in_dns_while_draining_is_undrained(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, (a, b) = await fleet_of(emulator_server, gateway, dns_server)
    async with aiohttp.ClientSession() as s:
        await s.post(b + "/_emu/faults", json={"action": "hang", "count": 1})
    replica_b = gw.gw.fleet.get(b)
    assert replica_b is not None
    pending = [asyncio.ensure_future(chat(gw.url)) for _ in range(4)]
    await wait_for(lambda: replica_b.inflight_requests == 1)  # keeps b from being removed while draining
    dns_server.set(NAME, "A", HOSTS[0])
    await wait_for(lambda: members(gw) == {a: False, b: True})
    dns_server.set(NAME, "A", *HOSTS)
    await wait_for(lambda: members(gw) == {a: False, b: False})
    assert gw.gw.fleet.get(b) is replica_b and not discovery(gw).draining  # the same replica, kept
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_failed_lookups_keep_the_last_known_set_and_are_logged_once(
    emulator_server: Emulators,
    gateway: StartGateway,
    dns_server: DnsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, urls = await fleet_of(emulator_server, gateway, dns_server)
    caplog.set_level(logging.INFO, logger="kvroute.discovery")
    dns_server.mode = "servfail"
    seen = dns_server.queries
    await wait_for(lambda: dns_server.queries >= seen + 10, timeout_s=5.0)  # several failed resolutions
    assert members(gw) == dict.fromkeys(urls, False)
    assert (await chat(gw.url))[0] == 200
    failures = [r.getMessage() for r in caplog.records if "cannot resolve" in r.getMessage()]
    assert len(failures) == 1 and "keeping its 2 replicas" in failures[0] and "SERVFAIL" in failures[0]
    dns_server.mode = "answer"
    await wait_for(lambda: any("resolves again" in r.getMessage() for r in caplog.records))
    assert len([r for r in caplog.records if "cannot resolve" in r.getMessage()]) == 1


async def test_a_name_that_stops_existing_drains_every_replica(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, _ = await fleet_of(emulator_server, gateway, dns_server)
    dns_server.clear(NAME)  # NXDOMAIN: an answer, not a failure
    await wait_for(lambda: members(gw) == {}, timeout_s=3.0)  # idle replicas go at once
    assert (await chat(gw.url))[0] == 503  # no replica left: nothing to serve any model (not a 404)


async def test_srv_records_give_named_replicas_with_their_own_ports(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    emus = [await emulator_server(*EMU_FLAGS) for _ in range(2)]
    ports = [e.port for e in emus]
    srv = "_http._tcp." + NAME
    dns_server.set(srv, "SRV", *(f"0 0 {p} localhost." for p in ports))
    gw = await gateway([], discover=(f"dns+srv://{srv}",), dns_server=dns_server.address, **FAST)
    assert members(gw) == {f"http://localhost:{p}": False for p in ports}
    status, replica = await chat(gw.url)
    assert status == 200 and replica in {f"http://localhost:{p}" for p in ports}
    dns_server.set(srv, "SRV", f"0 0 {ports[1]} localhost.")
    await wait_for(lambda: members(gw) == {f"http://localhost:{ports[1]}": False}, timeout_s=3.0)


async def test_replicas_given_with_backend_are_never_drained_by_discovery(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    port = shared_port(HOSTS)
    emus = [await emulator_server(*EMU_FLAGS, port=port, host=h) for h in HOSTS]
    dns_server.set(NAME, "A", *HOSTS)
    target = (f"dns://{NAME}:{port}",)
    gw = await gateway([emus[0].url], discover=target, dns_server=dns_server.address, **FAST)
    assert discovery(gw).owned == {emus[1].url}
    dns_server.clear(NAME)
    await wait_for(lambda: members(gw) == {emus[0].url: False}, timeout_s=3.0)
    await asyncio.sleep(0.3)
    assert members(gw) == {emus[0].url: False}


async def test_requests_are_served_while_a_lookup_waits_for_its_answer(
    emulator_server: Emulators, gateway: StartGateway, dns_server: DnsServer
) -> None:
    gw, urls = await fleet_of(emulator_server, gateway, dns_server)
    dns_server.mode = "hold"  # queries arrive and get no answer until released
    seen = dns_server.queries
    await wait_for(lambda: dns_server.queries > seen)
    for _ in range(3):
        status, replica = await chat(gw.url)
        assert status == 200 and replica in urls
    assert dns_server.mode == "hold" and members(gw) == dict.fromkeys(urls, False)
    dns_server.mode = "answer"
    dns_server.release()


async def test_aaaa_records_give_bracketed_ipv6_replicas(dns_server: DnsServer) -> None:
    dns_server.set("v6.kv.test", "AAAA", "fd00::7", "fd00::8")
    dns_server.set("v6.kv.test", "A", "10.1.2.3")
    resolver = DnsResolver(dns_server.address)
    found = await Discovery((), None, resolver).resolve(Target("dns", "v6.kv.test", 30000))  # type: ignore[arg-type]
    assert found == {"http://10.1.2.3:30000", "http://[fd00::7]:30000", "http://[fd00::8]:30000"}


def test_targets_from_flags_toml_and_environment(tmp_path: Any) -> None:
    cfg = tmp_path / "kvroute.toml"
    cfg.write_text(
        'discover = ["dns://a.test:30000", "dns+srv://_http._tcp.b.test"]\ndiscover_interval = 2\n'
    )
    st = load_settings(["--config", str(cfg)])
    assert st.discover == ("dns://a.test:30000", "dns+srv://_http._tcp.b.test") and st.discover_interval == 2
    env = {"KVROUTE_DISCOVER": "dns://c.test:1, dns://D.test:2", "KVROUTE_DNS_SERVER": "127.0.0.1"}
    st = load_settings([], env)
    assert st.discover == ("dns://c.test:1", "dns://d.test:2") and st.dns_server == "127.0.0.1:53"
    st = load_settings(
        ["--discover", "dns://e.test:1", "--discover", "dns://f.test:2", "--dns-server", "[::1]:5353"]
    )
    assert st.discover == ("dns://e.test:1", "dns://f.test:2") and st.dns_server == "[::1]:5353"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://a.test:1", "expected dns://NAME:PORT"),
        ("dns://a.test", "has no port"),
        ("dns+srv://_http._tcp.a.test:80", "SRV records carry the ports"),
        ("dns://10.0.0.1:30000", "give it with --backend"),
        ("dns://a.test:99999", "out of range"),
    ],
)
def test_a_bad_target_is_an_error_naming_the_setting(uri: str, message: str) -> None:
    with pytest.raises(SettingsError, match=rf"setting 'discover' \(from command line\): .*{message}"):
        load_settings(["--discover", uri])


def test_dns_server_must_be_an_address_with_an_optional_port() -> None:
    assert parse_dns_server("10.0.0.10") == ("10.0.0.10", 53) and parse_dns_server("[::1]:53") == ("::1", 53)
    for bad in ("kube-dns", "10.0.0.10:0", "10.0.0.10:x", "::1:53x"):
        with pytest.raises(ValueError, match="expected an IP address"):
            parse_dns_server(bad)
    assert str(parse_target("DNS://Sglang.NS.svc:30000")) == "dns://sglang.ns.svc:30000"
