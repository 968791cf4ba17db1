"""The status page in a real headless Chromium, against a gateway with two emulated replicas after traffic.

One replica runs HiCache write_back with --enable-metrics, the other has HiCache off and no metrics, so
the page must show both kinds of fill bars, the warnings, and the decisions' reasons. The page's
screenshot is kept in tests/artifacts/ (ignored by git); the path is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Emulators, StartGateway
from tests.proxy.browser import ARGS, chromium_or_skip
from tests.proxy.conftest import EMU_FLAGS, PLAIN_FLAGS
from tests.proxy.observe.test_metrics import chat

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


async def _rows(page: Any) -> dict[str, str]:
    rows = page.locator("#replicas tbody tr")
    return {await r.get_attribute("data-replica"): await r.inner_text() for r in await rows.all()}


async def _bar(page: Any, replica: str, tier: str, kind: str) -> tuple[float, float]:
    """(the fill the bar stands for, its drawn width / the track's width)."""
    track = page.locator(f'tr[data-replica="{replica}"] [data-tier="{tier}"] .bar.{kind}')
    outer, inner = await track.bounding_box(), await track.locator("div").bounding_box()
    assert outer is not None and inner is not None
    return float(await track.get_attribute("data-fill")), inner["width"] / outer["width"]


@pytest.mark.timeout(900)  # on a machine without Chromium, the set-up installs it with apt-get first
async def test_status_page_in_chromium(emulator_server: Emulators, gateway: StartGateway) -> None:
    executable = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    small = ("--max-total-tokens", "8000")  # a small GPU pool: the bars are visibly filled
    hicache, plain = await emulator_server(*EMU_FLAGS, *small), await emulator_server(*PLAIN_FLAGS, *small)
    gw = await gateway([hicache.url, plain.url], health_interval=0.1, policy="round_robin")
    for i in range(8):
        assert (await chat(gw.url, f"a long prompt number {i} " * 60, stream=True))[0] == 200
    await gw.gw.metrics.scraper.scrape_all(gw.gw.up)
    reasons = {d.reason for d in gw.gw.metrics.history.decisions()}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=ARGS, chromium_sandbox=False)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            await page.goto(gw.url + "/status")
            await page.wait_for_selector("#conn.live")
            header = await page.inner_text("header")
            assert "2/2 replicas healthy" in header and "policy round_robin" in header
            rows = await _rows(page)
            assert set(rows) == {hicache.url, plain.url}
            assert all("healthy" in text for text in rows.values())
            loads = [await c.get_attribute("title") for c in await page.locator("td.load").all()]
            assert len(loads) == 2 and all("last bytes" in t for t in loads)  # both streamed (liveness.py)
            assert "HiCache write_back" in rows[hicache.url] and "HiCache off" in rows[plain.url]
            assert "no /metrics" in rows[plain.url] and "scraped" in rows[hicache.url]
            assert all("cache model learned: the replica publishes no KV events" in t for t in rows.values())
            # fill bars: the model's for both, the replica's own only where it serves metrics
            for replica, kind in ((hicache.url, "model"), (hicache.url, "replica"), (plain.url, "model")):
                fill, drawn = await _bar(page, replica, "gpu", kind)
                assert 0.05 < fill < 1 and drawn == pytest.approx(fill, abs=0.02), (replica, kind)
            assert await page.locator(f'tr[data-replica="{plain.url}"] .bar.replica').count() == 0
            assert await page.locator("svg.spark polyline").count() >= 1  # a TTFT sparkline was drawn
            warnings = await page.inner_text("#warnings")
            assert (
                f"{plain.url}: HiCache is off" in warnings and f"{plain.url}: serves no /metrics" in warnings
            )
            shown = {await c.inner_text() for c in await page.locator("#decisions td.reason").all()}
            assert shown == reasons == {"round_robin"}
            assert "No documents warmed yet." in await page.inner_text(
                "#warmup"
            )  # the section is there, empty
            # it refreshes by itself: new data appears within a poll or two, without a reload
            gw.gw.metrics.register_section("warmup", lambda: [{"document": "doc-42", "state": "warm"}])
            await chat(gw.url, "one more request", stream=True)
            await expect(page.locator("#decisions tbody tr")).to_have_count(9, timeout=5000)
            await expect(page.locator("#warmup td", has_text="doc-42")).to_have_count(1, timeout=5000)
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "status_page.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"status page screenshot: {shot}")
            assert shot.stat().st_size > 10_000 and errors == []
        finally:
            await browser.close()


@pytest.mark.timeout(900)
async def test_a_protected_status_page_asks_for_its_key(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    """With an admin key, the page holds no data until the key is given; the key stays in the tab."""
    executable = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    emu = await emulator_server(*EMU_FLAGS)
    gw = await gateway([emu.url], health_interval=0.1, admin_key="adm", status_key="peek")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=ARGS, chromium_sandbox=False)
        try:
            page = await browser.new_page()
            await page.goto(gw.url + "/status")
            await expect(page.locator("#keyform")).to_be_visible(timeout=5000)
            assert "status or admin key" in await page.inner_text("#conn")
            assert await page.locator("#replicas tbody tr").count() == 0
            await page.fill("#key", "wrong")
            await page.click("#keybtn")
            await expect(page.locator("#keyform")).to_be_visible()
            await page.fill("#key", "peek")
            await page.click("#keybtn")
            await page.wait_for_selector("#conn.live")
            await expect(page.locator("#keyform")).to_be_hidden()
            assert "1/1 replicas healthy" in await page.inner_text("header")
        finally:
            await browser.close()


async def _lines(page: Any, selector: str) -> list[int]:
    """Line boxes of the text of each element ``selector`` matches."""
    script = """(els) => els.map((e) => { const r = document.createRange(); r.selectNodeContents(e);
        return new Set([...r.getClientRects()].map((b) => Math.round(b.top))).size; })"""
    return list(await page.locator(selector).evaluate_all(script))


@pytest.mark.timeout(900)
async def test_what_a_first_hour_reader_sees(emulator_server: Emulators, gateway: StartGateway) -> None:
    """One line of load per replica; "No warnings." in plain grey; a TTFT cell that says why it has no
    TTFT; the warmed documents one click from the top (the section collapsed to its count when long);
    and a warning once the warmed documents exceed the replica's GPU pool."""
    executable = chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    emu = await emulator_server(*EMU_FLAGS, "--max-total-tokens", "8000")
    gw = await gateway([emu.url], health_interval=0.1)
    for i in range(2):
        assert (await chat(gw.url, f"not streamed {i} " * 20, stream=False))[0] == 200
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=ARGS, chromium_sandbox=False)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(gw.url + "/status")
            await page.wait_for_selector("#conn.live")
            assert await _lines(page, "td.load") == [1]
            none = page.locator("#warnings li")
            assert await none.inner_text() == "No warnings."
            colour = await none.evaluate("(e) => getComputedStyle(e).color")
            assert colour == "rgb(87, 96, 106)"  # --muted, not --warn (rgb(154, 103, 0))
            ttft = await page.inner_text("td.ttft")
            assert "no TTFT in its last 2 requests" in ttft and "no streamed requests" not in ttft
            assert await page.locator("#warmlink").is_hidden()
            docs = [
                {"id": f"doc-{i}", "text": f"document {i} " + "words of a document " * 200} for i in range(12)
            ]
            async with aiohttp.ClientSession() as s:
                body = {"documents": docs, "replicas": 1, "wait": True}
                async with s.post(gw.url + "/v1/warmup", json=body) as r:
                    assert r.status == 200, await r.text()
                    job = await r.json()
            placed = sum(d["tokens"] for d in job["documents"])
            assert placed > 8000
            link = page.locator("#warmlink")
            await expect(link).to_be_visible(timeout=5000)
            assert (await link.inner_text()).startswith("warmed: 12 documents (12 warm)")
            assert await page.locator("#warmup-details").evaluate("(e) => e.open") is False  # long: a count
            assert await page.locator("#warmup td", has_text="doc-11").is_hidden()
            await link.click()
            assert await page.locator("#warmup-details").evaluate("(e) => e.open") is True
            await expect(page.locator("#warmup td", has_text="doc-11")).to_be_visible()
            top = await page.locator("#warmup-section").evaluate("(e) => e.getBoundingClientRect().top")
            assert 0 <= top < 900  # scrolled to it
            drawn = await page.inner_text("#conn")
            await expect(page.locator("#conn")).not_to_have_text(drawn, timeout=5000)  # redrawn since
            assert await page.locator("#warmup-details").evaluate("(e) => e.open") is True
            warning = page.locator("#warnings li", has_text="exceeds its GPU pool")
            await expect(warning).to_have_count(1, timeout=5000)
            assert f"{emu.url}: the working set of" in await warning.inner_text()
        finally:
            await browser.close()
