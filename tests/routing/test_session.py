"""The session table: last replica per session, LRU-bounded; the stick-or-yield rule."""

from __future__ import annotations

from routing.session import SessionTable, should_stick


def test_remembers_the_last_replica_and_forgets_the_least_recent_beyond_the_bound() -> None:
    table = SessionTable(max_sessions=100)
    for i in range(100):
        table.remember(f"s{i}", "a")
    table.remember("s0", "b")  # s0 becomes the most recent
    table.remember("new", "c")
    assert len(table) <= 100
    assert table.get("s0") == "b" and table.get("new") == "c" and table.get("s1") is None
    assert table.get(None) is None
    table.remember(None, "a")
    table.forget_replica("b")
    assert table.get("s0") is None and table.get("new") == "c"


def test_stick_unless_the_sessions_replica_costs_more_than_factor_times_the_best() -> None:
    costs = {"a": 1.9, "b": 1.0}
    assert should_stick(costs, "a", 2.0)
    assert not should_stick({"a": 2.1, "b": 1.0}, "a", 2.0)
    assert not should_stick(costs, "gone", 2.0)


def test_crowded_replicas_hold_more_than_factor_times_the_fewest_sessions_plus_one() -> None:
    table = SessionTable(max_sessions=1000)
    for i in range(6):
        table.remember(f"a{i}", "a")
    table.remember("b0", "b")
    assert table.crowded(["a", "b", "c"], 1.3) == {"a"}  # fewest 0 (c): bound 1
    table.remember("a0", "c")  # a session that moved
    assert (table.held("a"), table.held("c")) == (5, 1)
    assert table.crowded(["a", "b", "c"], 0) == set()


def test_a_replica_holding_no_session_is_not_left_idle() -> None:
    """Three replicas with 5 sessions each and one with none: against the mean (bound 5.9) nobody would
    be crowded and the empty replica would never warm up; against the fewest (bound 1) it takes the next."""
    table = SessionTable(max_sessions=1000)
    for r in "abc":
        for i in range(5):
            table.remember(f"{r}{i}", r)
    assert table.crowded(["a", "b", "c", "d"], 1.3) == {"a", "b", "c"}
    for i in range(4):
        table.remember(f"d{i}", "d")
    assert table.crowded(["a", "b", "c", "d"], 1.3) == set()  # fewest 4: bound 6.2
