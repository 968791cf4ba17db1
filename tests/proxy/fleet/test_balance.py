"""proxy/fleet/balance.py: seconds a replica sits idle while another has a queue, and its metric."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.fleet.balance import QUEUED, Balance
from proxy.fleet.load import Work
from proxy.fleet.replica import Lease, Replica
from tests.proxy.conftest import ADMIN, Stack


def replica(url: str) -> Replica:
    r = Replica(url)
    r.healthy = True
    return r


def lease(r: Replica) -> Lease:
    return Lease(r, Work(0.0, prefill_tokens=100, work_s=1.0, ttft_s=1.0, budget=8))


def test_an_idle_replica_is_charged_only_while_another_has_a_queue() -> None:
    a, b, book = replica("http://a"), replica("http://b"), Balance()
    book.refresh([a, b], 0.0)
    queued = [lease(a) for _ in range(QUEUED)]
    book.changed(a, 1.0)  # a has a queue from t=1, b idle
    book.refresh([a, b], 4.0)
    assert (book.seconds("http://b"), book.seconds("http://a")) == (pytest.approx(3.0), 0.0)
    queued[0].release()
    book.changed(a, 6.0)  # the 2 s before the release still count; from now a has one request only
    book.refresh([a, b], 9.0)
    assert book.seconds("http://b") == pytest.approx(5.0)
    lease(b)
    book.changed(b, 10.0)  # b busy: its spell ends with what it had
    lease(a)
    book.changed(a, 11.0)
    book.refresh([a, b], 20.0)
    assert book.seconds("http://b") == pytest.approx(5.0)


def test_every_idle_replica_is_charged_from_when_its_spell_began() -> None:
    a, b, c, book = replica("http://a"), replica("http://b"), replica("http://c"), Balance()
    lease(b)
    book.refresh([a, b, c], 0.0)  # a and c idle, nobody queued
    for _ in range(QUEUED):
        lease(a)
    book.changed(a, 2.0)  # a queued from t=2: only c is idle now
    book.refresh([a, b, c], 5.0)
    assert (book.seconds("http://c"), book.seconds("http://a"), book.seconds("http://b")) == (
        pytest.approx(3.0),
        0.0,
        0.0,
    )


def test_a_busy_draining_or_unhealthy_replica_is_not_charged() -> None:
    a, b, c, d, book = (
        replica("http://a"),
        replica("http://b"),
        replica("http://c"),
        replica("http://d"),
        Balance(),
    )
    for _ in range(QUEUED):
        lease(a)
    lease(b)  # busy with one request: not idle
    c.draining, d.healthy = True, False
    book.refresh([a, b, c, d], 0.0)
    book.refresh([a, b, c, d], 10.0)
    assert [book.seconds(r.id) for r in (a, b, c, d)] == [0.0] * 4


def test_a_queue_on_a_draining_replica_charges_nobody() -> None:
    a, b, book = replica("http://a"), replica("http://b"), Balance()
    for _ in range(QUEUED):
        lease(a)
    a.draining = True
    book.refresh([a, b], 0.0)
    book.refresh([a, b], 5.0)
    assert book.seconds("http://b") == 0.0


def test_forget_drops_a_removed_replica() -> None:
    a, b, book = replica("http://a"), replica("http://b"), Balance()
    for _ in range(QUEUED):
        lease(a)
    book.refresh([a, b], 0.0)
    book.refresh([a, b], 2.0)
    assert book.seconds("http://b") == pytest.approx(2.0)
    book.forget("http://b")
    assert book.seconds("http://b") == 0.0


async def test_the_metric_is_exported_per_replica(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/metrics", headers=ADMIN) as r:
        text = await r.text()
    assert text.count("kvroute_replica_idle_while_queued_seconds_total{replica=") == len(stack.replicas)
