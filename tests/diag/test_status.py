"""`kvroute status`: the gateway's /status in the terminal, once (a subprocess, as a user runs it) or
refreshed in place; and what it prints for partial documents and for URLs that are no gateway."""

from __future__ import annotations

import asyncio
import io
import sys
from typing import Any

import pytest

from diag import status
from diag.status_view import BAR_CELLS, bar, render, sparkline
from tests.conftest import Emulators, StartGateway
from tests.diag.test_errors import closed_port, run
from tests.proxy.conftest import EMU_FLAGS, PLAIN_FLAGS
from tests.proxy.observe.test_metrics import chat


async def _fleet(emulator_server: Emulators, gateway: StartGateway) -> tuple[str, str, str]:
    hicache, plain = await emulator_server(*EMU_FLAGS), await emulator_server(*PLAIN_FLAGS)
    gw = await gateway([hicache.url, plain.url], health_interval=0.1, policy="round_robin")
    for i in range(4):
        assert (await chat(gw.url, f"question {i % 2} " * 50, stream=True))[0] == 200
    await gw.gw.metrics.scraper.scrape_all(gw.gw.up)
    return gw.url, hicache.url, plain.url


async def test_once_prints_one_snapshot(emulator_server: Emulators, gateway: StartGateway) -> None:
    url, hicache, plain = await _fleet(emulator_server, gateway)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.cli", "status", "--gateway", url, "--once",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    text = out.decode()
    assert proc.returncode == 0 and err == b"", err
    assert text.startswith(f"kvroute status  {url}  policy round_robin  2/2 replicas healthy")
    assert f"{hicache}  healthy  emu-model  HiCache write_back  scraped" in text
    assert f"{plain}  healthy  emu-model  HiCache off  no /metrics" in text
    gpu = [line for line in text.splitlines() if line.startswith("  gpu ")]
    assert len(gpu) == 2 and "replica [" in gpu[0] and "replica" not in gpu[1]
    assert text.split("recent decisions")[1].count(" round_robin ") == 4
    assert "  ttft     " in text and "no streamed requests" not in text
    assert f"{plain}: HiCache is off" in text and f"{plain}: serves no /metrics" in text
    assert "\x1b[" not in text  # --once never draws in place


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "separator"), [(Tty(), status.CLEAR), (io.StringIO(), "\nkvroute status")]
)
async def test_refreshing(
    emulator_server: Emulators, gateway: StartGateway, stream: io.StringIO, separator: str
) -> None:
    url, _, _ = await _fleet(emulator_server, gateway)
    args = status.parse_args(["--gateway", url, "--interval", "0.05"])
    task = asyncio.ensure_future(status.watch(args, stream))
    try:
        for _ in range(200):
            if stream.getvalue().count(separator) >= 3:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    frames = stream.getvalue().split(separator)
    assert len(frames) >= 4 and all("recent decisions" in f for f in frames[1:3])


def test_unreachable_gateway() -> None:
    port = closed_port()
    code, out, err = run(status.main, "--gateway", f"http://127.0.0.1:{port}", "--once")
    assert (
        code == 1
        and out == ""
        and err.startswith(f"kvroute status: cannot connect to http://127.0.0.1:{port}")
    )
    assert err.count("\n") == 1


async def test_a_replica_is_no_gateway(emulator_server: Emulators) -> None:
    emu = await emulator_server(*EMU_FLAGS)
    args = status.parse_args(["--gateway", emu.url, "--once"])
    with pytest.raises(status.DiagError, match="is not a kvroute gateway"):
        await status.watch(args, io.StringIO())


@pytest.mark.parametrize(
    "argv", [["--once"], ["--gateway", "ftp://x", "--once"], ["--gateway", "http://a", "--interval", "0"]]
)
def test_bad_arguments(argv: list[str]) -> None:
    code, _, err = run(status.main, *argv)
    assert code == 2 and "usage: kvroute status" in err


def test_render_survives_a_partial_document() -> None:
    doc: dict[str, Any] = {"policy": "cost", "replicas": [{"id": "http://r1", "healthy": False}]}
    text = render(doc, "http://gw")
    assert "http://r1  unhealthy  ?  HiCache off  not scraped yet" in text
    assert "  gpu      model –" in text and "  ttft     no requests yet" in text
    unstreamed = render({**doc, "replicas": [{"id": "http://r1", "requests_recent": 3}]}, "http://gw")
    assert "  ttft     no TTFT in its last 3 requests (only streamed answers have one)" in unstreamed
    assert "http://r1: out of the pool" in text and "none yet" in text


def test_bars_and_sparklines() -> None:
    assert bar(0.5) == f"[{'#' * (BAR_CELLS // 2)}{'-' * (BAR_CELLS // 2)}]  50%"
    assert bar(1.7) == f"[{'#' * BAR_CELLS}] 170%"  # the cells stop at full, the figure does not
    assert bar(None) == "–"
    assert sparkline([1.0, 2.0, 3.0, 1.0]) == "▁▅█▁" and sparkline([]) == ""


def test_the_warm_up_section_is_a_table() -> None:
    doc: dict[str, Any] = {"policy": "cost", "replicas": []}
    docs = [
        {"job": "j1", "tenant": None, "document": "handbook.md", "tokens": 13762, "status": "warm"}
        | {"replicas": "http://r1 warm"},
        {"job": "j1", "tenant": "acme", "document": "faq.txt", "tokens": 812, "status": "warming"}
        | {"replicas": "http://r1 warm, http://r2 warming"},
    ]
    doc["warmup"] = {"jobs": 1, "steps": 9, "preempted_steps": 2, "documents": docs}
    section = render(doc, "http://gw").split("\nwarm-up")[1]
    lines = section.splitlines()
    assert lines[0] == "  1 jobs · 2 documents (1 warm, 1 warming) · 14,574 tokens · 9 steps, 2 preempted"
    assert lines[1].split() == ["document", "tenant", "tokens", "status", "replicas"]
    assert lines[2].split() == ["handbook.md", "-", "13,762", "warm", "http://r1", "warm"]
    assert lines[3].index("812") == lines[2].index("13,762") and "{" not in section
    many = {**doc["warmup"], "documents": docs * 15}
    assert render({**doc, "warmup": many}, "http://gw").endswith("… and 10 more documents")
