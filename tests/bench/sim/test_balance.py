"""The fleet-balance metric on hand-built cases with known answers."""

from __future__ import annotations

import pytest

from bench.sim.balance import BalanceMeter


def test_two_replicas_idle_while_the_other_queues() -> None:
    """A and B join at 0. A gets three requests at t=1, 2, 3; its engine admits them at 1, 6, 11 and
    they end at 6, 11, 16. B gets one request at t=4 that is admitted at once and ends at 8. (The meter
    is told every change in time order, as the simulator tells it.)

    A has a queue during [2, 11) (a request waits from 2 to 6, and from 3 to 11). B is idle over [0, 4)
    and [8, 16): while A queues that is [2, 4) + [8, 11) = 5 s. A is never idle while B queues (B never
    queues): 0 s."""
    m = BalanceMeter()
    m.joined("A", 0.0)
    m.joined("B", 0.0)
    m.arrived("A", 1.0)
    m.admitted("A", 1.0)
    m.arrived("A", 2.0)
    m.arrived("A", 3.0)
    m.arrived("B", 4.0)
    m.admitted("B", 4.0)
    m.ended("A", 6.0, admitted=True)
    m.admitted("A", 6.0)
    m.ended("B", 8.0, admitted=True)
    m.ended("A", 11.0, admitted=True)
    m.admitted("A", 11.0)
    m.ended("A", 16.0, admitted=True)
    m.close(20.0)
    assert m.idle_while_queued == {"A": 0.0, "B": pytest.approx(5.0)}
    assert m.total == pytest.approx(5.0)


def test_a_replica_out_of_the_fleet_is_not_counted() -> None:
    """B joins at 5 and leaves (drains) at 9 while A queues from 0 to 12: B counts 4 s, no more."""
    m = BalanceMeter()
    m.joined("A", 0.0)
    m.arrived("A", 0.0)
    m.admitted("A", 0.0)
    m.arrived("A", 0.0)  # waits behind the first until 12
    m.joined("B", 5.0)
    m.left("B", 9.0)
    m.admitted("A", 12.0)
    m.ended("A", 12.0, admitted=True)
    m.ended("A", 15.0, admitted=True)
    m.close(15.0)
    assert m.idle_while_queued == {"A": 0.0, "B": pytest.approx(4.0)}


def test_a_request_that_fails_while_waiting_leaves_the_queue() -> None:
    """A's only request waits from 0 and fails at 2 without being admitted: B, idle, counts 2 s."""
    m = BalanceMeter()
    m.joined("A", 0.0)
    m.joined("B", 0.0)
    m.arrived("A", 0.0)
    m.ended("A", 2.0, admitted=False)
    m.close(10.0)
    assert m.idle_while_queued == {"A": 0.0, "B": pytest.approx(2.0)}
