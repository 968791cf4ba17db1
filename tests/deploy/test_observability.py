"""deploy/grafana and deploy/prometheus: the dashboard asks only for series kvroute and SGLang export, and
a real Prometheus scrapes a gateway and a replica and evaluates every one of the dashboard's queries."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Emulators, StartGateway
from tests.deploy.prometheus_bin import prometheus_or_skip
from tests.proxy.conftest import EMU_FLAGS
from tests.proxy.observe.test_metrics import chat
from tests.proxy.prom import samples

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "kvroute.json"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
NAME = re.compile(r"\b(kvroute_[a-z0-9_]+|sglang:[a-z0-9_]+|process_[a-z_]+)")
SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables as 'All' would fill them."""
    return expr.replace("$__rate_interval", "1m").replace("$gateway", ".*").replace("$replica", ".*")


def test_the_dashboard_is_importable_with_the_datasource_as_a_variable() -> None:
    doc = dashboard()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert {"gateway", "replica"} <= set(variables)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "kvroute-fleet"
    for p in doc["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(
            t["datasource"]["uid"] == "${datasource}" and t["expr"] for t in p["targets"]
        )
        box = p["gridPos"]
        assert box["x"] + box["w"] <= 24 and box["h"] > 0


async def _fleet(emulator_server: Emulators, gateway: StartGateway) -> tuple[str, str]:
    emu = await emulator_server(*EMU_FLAGS)
    gw = await gateway([emu.url], health_interval=30.0)
    for i in range(6):
        assert (await chat(gw.url, f"question {i % 2}", stream=i % 2 == 0))[0] == 200
    await gw.gw.metrics.scraper.scrape_all(gw.gw.up)
    return gw.url, emu.url


async def test_every_series_the_dashboard_names_is_exported(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    gw_url, emu_url = await _fleet(emulator_server, gateway)
    exported: set[str] = set()
    async with aiohttp.ClientSession() as s:
        for url in (gw_url, emu_url):
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
            exported |= set(samples(text)) | declared  # a counter nothing increased yet has no sample
    named = {n for q in queries() for n in NAME.findall(q)}
    missing = {n for n in named if n not in exported and not any(n + sfx in exported for sfx in SUFFIXES)}
    assert not missing and len(named) > 25


@pytest.mark.timeout(600)  # the first run may fetch Debian's prometheus package
def test_promtool_accepts_the_scrape_configuration() -> None:
    _, promtool = prometheus_or_skip()
    done = subprocess.run([promtool, "check", "config", str(PROMETHEUS_YML)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    text = PROMETHEUS_YML.read_text()
    assert "job_name: kvroute" in text and "job_name: sglang" in text  # the dashboard's job sglang panels


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _query(http: aiohttp.ClientSession, base: str, expr: str) -> list[Any]:
    async with http.get(base + "/api/v1/query", params={"query": expr}) as r:
        doc = await r.json()
    assert r.status == 200 and doc["status"] == "success", (expr, doc)
    result: list[Any] = doc["data"]["result"]
    return result


@pytest.mark.timeout(600)
async def test_prometheus_scrapes_the_fleet_and_runs_every_query(
    emulator_server: Emulators, gateway: StartGateway, tmp_path: Path
) -> None:
    prometheus, _ = prometheus_or_skip()
    gw_url, emu_url = await _fleet(emulator_server, gateway)
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    jobs = {"kvroute": gw_url, "sglang": emu_url}  # the jobs of deploy/prometheus, on the test's targets
    scrape = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['{url.removeprefix('http://')}']\n"
        for job, url in jobs.items()
    )
    config.write_text(
        f"global:\n  scrape_interval: 500ms\n  scrape_timeout: 500ms\nscrape_configs:\n{scrape}"
    )
    argv = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    with (tmp_path / "log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await _wait_up(http, base, len(jobs), proc)
            for _ in range(3):  # a few more requests between scrapes: rates over more than one sample
                await chat(gw_url, "question 0", stream=True)
                await asyncio.sleep(0.6)
            empty = [q for q in queries() if not await _query(http, base, concrete(q))]
            for must in ("kvroute_replica_healthy", "kvroute_cache_model_tokens", "sglang:token_usage"):
                assert await _query(http, base, must), must
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
    # every query returns series, but those of failures this traffic never had, and the "no /metrics" line
    quiet = ("kvroute_errors_total", "upstream_errors", "retries", "stream_errors", "client_disconnects")
    assert empty and all(any(q in e for q in quiet) or e.endswith("== 0") for e in empty), empty


async def _wait_up(
    http: aiohttp.ClientSession, base: str, jobs: int, proc: asyncio.subprocess.Process
) -> None:
    for _ in range(150):
        if proc.returncode is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}")
        try:
            async with http.get(base + "/api/v1/targets") as r:
                targets = (await r.json())["data"]["activeTargets"]
            if len(targets) == jobs and all(t["health"] == "up" for t in targets):
                return
            assert all(t["health"] != "down" for t in targets), [t["lastError"] for t in targets]
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    pytest.fail("prometheus did not scrape both targets within 15 s")
