"""proxy/observe/exposition.py writes what prometheus-client would: the same samples for the same
observations."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

from proxy.observe.exposition import FastCounter, FastHistogram, TextFamily, number, render
from proxy.observe.metrics import TTFT_BUCKETS
from tests.proxy.conftest import Stack
from tests.proxy.observe.test_metrics import chat
from tests.proxy.prom import samples

ODD = ['a"quote', "back\\slash", "new\nline", "plain", "ünïcode"]


def _without_created(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {k: v for k, v in samples(text).items() if not k.endswith("_created")}


def test_histogram_matches_prometheus_client() -> None:
    rng = random.Random(7)
    values = [*TTFT_BUCKETS, 0.0, 1e9, math.inf, *(rng.expovariate(2.0) for _ in range(500))]
    registry = CollectorRegistry()
    theirs = Histogram("h_seconds", "help", ["route", "replica"], buckets=TTFT_BUCKETS, registry=registry)
    ours = FastHistogram("h_seconds", "help", ("route", "replica"), TTFT_BUCKETS)
    for i, v in enumerate(values):
        labels = ("chat" if i % 3 else "generate", ODD[i % len(ODD)])
        theirs.labels(*labels).observe(v)
        ours.observe(v, *labels)
    assert _without_created(render([ours]).decode()) == _without_created(generate_latest(registry).decode())


def test_counter_matches_prometheus_client() -> None:
    registry = CollectorRegistry()
    theirs = Counter("c", "help\nwith a newline and a \\", ["replica"], registry=registry)
    ours = FastCounter("c", "help\nwith a newline and a \\", ("replica",))
    for i in range(50):
        theirs.labels(ODD[i % 5]).inc(i * 0.5)
        ours.labels(ODD[i % 5]).inc(i * 0.5)
    mine, reference = render([ours]).decode(), generate_latest(registry).decode()
    assert _without_created(mine) == _without_created(reference)
    assert mine.splitlines()[:2] == reference.splitlines()[:2]  # HELP (escaped) and TYPE lines
    assert ours.value(ODD[0]) == sum(i * 0.5 for i in range(0, 50, 5))
    with pytest.raises(ValueError, match="only goes up"):
        ours.labels("x").inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        ours.labels("x", "y")


@pytest.mark.parametrize(
    "x",
    [
        0,
        1,
        7,
        999_999,
        1_000_000,
        12_345_678,
        0.0,
        0.25,
        1e-7,
        3.0,
        999_999.5,
        1.5e7,
        -2.5,
        math.inf,
        -math.inf,
    ],
)
def test_numbers_are_written_as_prometheus_client_writes_them(x: float) -> None:
    assert number(x) == floatToGoString(x)


def test_text_family_escapes_label_values() -> None:
    fam = TextFamily("g", "help", "gauge", ("replica", "tier"))
    for v in ODD:
        fam.add((v, "gpu"), 1.5)
    parsed = samples(fam.text())["g"]
    assert {dict(k)["replica"] for k in parsed} == set(ODD) and set(parsed.values()) == {1.5}


async def test_the_gateway_exposition_parses_and_agrees_with_the_registry(stack: Stack) -> None:
    for i in range(6):
        await chat(stack.url, f"question {i % 2}", stream=i % 2 == 0)
    await stack.gw.metrics.scraper.scrape_all(stack.gw.up)
    m = stack.gw.metrics
    fast, reference = (
        _without_created(m.render().decode()),
        _without_created(generate_latest(m.registry).decode()),
    )
    moving = {k for k in fast if k.startswith("process_") or "scrape_age" in k or "utilization" in k}
    moving |= {k for k in fast if "arrival_rate" in k}
    assert set(fast) == set(reference) and len(fast) > 50
    assert {k: v for k, v in fast.items() if k not in moving} == {
        k: v for k, v in reference.items() if k not in moving
    }
