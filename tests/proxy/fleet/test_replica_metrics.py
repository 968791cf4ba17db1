"""The replica scraper: real emulated replicas with and without --enable-metrics, one that stops, and the
parsing and windowing rules on SGLang-shaped expositions."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.fleet.replica_metrics import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    ReplicaScraper,
    Scraped,
    parse,
    scrape_interval,
)
from proxy.upstream.client import Upstream
from tests.conftest import Emulators, StartGateway
from tests.proxy.conftest import EMU_FLAGS
from tests.proxy.observe.test_metrics import chat
from tests.proxy.prom import samples, value

NO_METRICS = tuple(f for f in EMU_FLAGS if f != "--enable-metrics")


async def _own(url: str, name: str, **labels: str) -> float:
    """A sample of a replica's own /metrics, read straight from it."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        found = value(await r.text(), name, **labels)
    assert found is not None, name
    return found


async def test_replicas_with_and_without_metrics(emulator_server: Emulators, gateway: StartGateway) -> None:
    on, off = await emulator_server(*EMU_FLAGS), await emulator_server(*NO_METRICS)
    gw = await gateway([on.url, off.url], health_interval=30.0, policy="round_robin")  # one background scrape
    scraper = gw.gw.metrics.scraper
    await scraper.scrape_all(gw.gw.up)  # before any traffic: every counter is 0
    for _ in range(4):
        assert (await chat(gw.url, "one question, asked again", stream=True))[0] == 200
    for r in (on, off):
        replica = gw.gw.fleet.get(r.url)
        assert replica is not None
        replica.running_reserve = 0.3
    await scraper.scrape_all(gw.gw.up)
    text = gw.metrics()
    assert value(text, "kvroute_replica_metrics_enabled", replica=on.url) == 1
    assert value(text, "kvroute_replica_metrics_enabled", replica=off.url) == 0
    assert value(text, "kvroute_replica_scrape_errors_total", replica=off.url) == 0  # a 404 is no error
    prompt = await _own(on.url, "sglang:prompt_tokens_total", model_name="emu-model")
    device = await _own(on.url, "sglang:cached_tokens_total", model_name="emu-model", cache_source="device")
    assert value(text, "kvroute_replica_sglang_prompt_tokens_total", replica=on.url) == prompt
    assert prompt == value(text, "kvroute_prompt_tokens_total", replica=on.url)  # all its traffic came via us
    cached = value(text, "kvroute_replica_sglang_cached_tokens_total", replica=on.url, cache_source="device")
    assert cached == device == value(text, "kvroute_cached_tokens_total", replica=on.url) > 0
    assert value(text, "kvroute_replica_hit_ratio", replica=on.url, tier="device") == pytest.approx(
        device / prompt
    )
    assert value(text, "kvroute_replica_hit_ratio", replica=on.url, tier="host") == 0
    assert value(text, "kvroute_replica_sglang_hicache_host_total_tokens", replica=on.url) == 200_016
    assert value(text, "kvroute_replica_sglang_max_total_num_tokens", replica=on.url) == 100_000
    assert value(text, "kvroute_replica_sglang_num_running_reqs", replica=on.url) == 0
    assert 0 <= (value(text, "kvroute_replica_scrape_age_seconds", replica=on.url) or -1) < 5
    assert 0 < (value(text, "kvroute_replica_scrape_duration_seconds", replica=on.url) or 0) < 2
    sglang = [
        k for name, fam in samples(text).items() if name.startswith("kvroute_replica_sglang_") for k in fam
    ]
    assert {dict(k)["replica"] for k in sglang} == {on.url}
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/status") as r:
        doc: dict[str, Any] = await r.json()
    rows = {row["id"]: row for row in doc["replicas"]}
    assert rows[on.url]["reported"]["enabled"] is True and rows[off.url]["reported"]["enabled"] is False
    assert rows[on.url]["reported"]["gauges"]["hicache_host_total_tokens"] == 200_016
    # the emulator charges running requests their whole output: new_token_ratio 1.0, which the fleet takes
    assert rows[on.url]["reported"]["gauges"]["new_token_ratio"] == 1.0
    assert (rows[on.url]["running_reserve"], rows[off.url]["running_reserve"]) == (1.0, 0.3)
    assert rows[off.url]["reported"]["gauges"] == {}
    assert rows[on.url]["hit_ratio"]["device"] == pytest.approx(device / prompt)
    assert rows[off.url]["hit_ratio"]["device"] is None and rows[off.url]["hit_ratio"]["gateway"] > 0


async def test_a_replica_that_stops_answering(emulator_server: Emulators, gateway: StartGateway) -> None:
    emu = await emulator_server(*EMU_FLAGS)
    gw = await gateway([emu.url], health_interval=30.0)  # no background scrape during the test
    scraper = gw.gw.metrics.scraper
    await scraper.scrape_all(gw.gw.up)
    await emulator_server.stop(emu)
    await scraper.scrape(gw.gw.up, emu.url)  # the poller may already have taken it out of the pool
    state = scraper.states[emu.url]
    assert state.errors == 1 and state.last_error is not None and emu.url in state.last_error
    assert state.latest is not None  # the last figures stay visible, with their age
    text = gw.metrics()
    assert value(text, "kvroute_replica_scrape_errors_total", replica=emu.url) == 1
    assert value(text, "kvroute_replica_sglang_max_total_num_tokens", replica=emu.url) == 100_000


async def test_an_unhealthy_replica_keeps_its_last_figures(emulator_server: Emulators) -> None:
    emu = await emulator_server(*EMU_FLAGS)
    fleet = {emu.url: True}
    scraper = ReplicaScraper(lambda: list(fleet.items()))
    async with aiohttp.ClientSession() as session:
        up = Upstream(session, 5.0)
        await scraper.scrape_all(up)
        first = scraper.states[emu.url].last_ok
        await scraper.scrape_all(up)
        second = scraper.states[emu.url].last_ok
        assert first is not None and second is not None and second > first  # healthy: scraped again
        fleet[emu.url] = False  # out of the pool: not scraped, last figures kept, their age grows
        await scraper.scrape_all(up)
        assert scraper.states[emu.url].last_ok == second and scraper.states[emu.url].latest is not None
        del fleet[emu.url]  # left the fleet: forgotten
        await scraper.scrape_all(up)
        assert scraper.states == {}


EXPOSITION = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="1"} 3.0
sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 2.0
sglang:num_running_reqs_offline_batch{model_name="m"} 99.0
sglang:token_usage{dp_rank="0",model_name="m"} 0.25
sglang:token_usage{dp_rank="1",model_name="m"} 0.5
sglang:hicache_host_used_tokens{model_name="m",tp_rank="0"} 100.0
sglang:hicache_host_used_tokens{model_name="m",tp_rank="1"} 120.0
sglang:prompt_tokens_total{model_name="m"} 1000.0
sglang:cached_tokens_total{cache_source="device",model_name="m"} 400.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 300.0
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
"""


def test_parse_takes_the_wanted_series_per_rank() -> None:
    s = parse(EXPOSITION, at=1.0)
    assert s.gauges == {"num_running_reqs": 5.0, "token_usage": 0.5, "hicache_host_used_tokens": 120.0}
    assert s.prompt_tokens == 1000.0 and s.cached_tokens == {"device": 400.0, "host": 300.0}
    assert parse("", at=0.0) == Scraped(0.0, {}, 0.0, {})
    with pytest.raises(ValueError):
        parse("sglang:token_usage{model_name= 1\n", at=0.0)


def _sample(at: float, prompt: float, device: float, host: float = 0.0) -> Scraped:
    return Scraped(at, {}, prompt, {"device": device, "host": host})


def test_hit_ratio_over_the_window_and_restarts() -> None:
    sc = ReplicaScraper(lambda: [], window_s=60.0)
    sc.record("r", _sample(0.0, 0, 0))
    assert sc.hit_ratio("r") is None  # one sample: no interval yet
    sc.record("r", _sample(30.0, 1000, 500, 100))
    assert sc.hit_ratio("r") == {"device": 0.5, "host": 0.1, "storage": 0.0}
    sc.record("r", _sample(70.0, 2000, 1500, 100))  # t=0 is now older than the window
    sc.record("r", _sample(95.0, 3000, 1500, 100))
    assert sc.hit_ratio("r") == {"device": 0.5, "host": 0.0, "storage": 0.0}  # (1500-500)/(3000-1000)
    sc.record("r", _sample(100.0, 10, 0))  # counters went down: the replica restarted
    assert sc.hit_ratio("r") is None and len(sc.states["r"].window) == 1


@pytest.mark.parametrize(("health", "scrape"), [(0.01, MIN_INTERVAL_S), (5.0, 5.0), (60.0, MAX_INTERVAL_S)])
def test_the_scrape_interval_is_bounded(health: float, scrape: float) -> None:
    assert scrape_interval(health) == scrape
