"""The restart owner (proxy/fleet/restarts.py): one reset per real restart, whichever detector sees it
first, never a second one after the replica's own KV events rebuilt the view."""

from __future__ import annotations

import pytest

import proxy.fleet.restarts as mod
from proxy.fleet.restarts import FEED_MARK_S, Restarts


class Feed:
    def __init__(self) -> None:
        self.epochs = 0

    def new_epoch(self) -> None:
        self.epochs += 1


def owner(exact: bool = True) -> tuple[Restarts, list[str], Feed]:
    said: list[str] = []
    restarts = Restarts(
        lambda r: said.append(f"restart {r}"),
        lambda r, why: said.append(f"kv_reset {r} {why}"),
        lambda r: exact,
    )
    feed = Feed()
    restarts.attach("r", feed)
    return restarts, said, feed


def test_the_feed_first_then_the_start_time_resets_once() -> None:
    restarts, said, feed = owner()
    restarts.publisher_restarted("r")  # the sequence went back: reset now, rebuilt by what follows
    restarts.started("r")  # the start time, read a minute later: the rebuilt view stays
    assert said == ["kv_reset r restart"] and feed.epochs == 0
    assert restarts.counts == {"restarts": 1, "rebuilt_by_events": 1}


def test_the_start_time_first_resets_and_starts_a_new_epoch() -> None:
    restarts, said, feed = owner()
    restarts.started("r")
    assert said == ["restart r"] and feed.epochs == 1
    restarts.started("r")  # another restart, nothing from the feed in between: reset again
    assert said == ["restart r", "restart r"] and feed.epochs == 2


def test_an_old_mark_does_not_cover_a_later_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    restarts, said, _ = owner()
    now = [1000.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: now[0])
    restarts.publisher_restarted("r")
    now[0] += FEED_MARK_S + 1
    restarts.started("r")
    assert said == ["kv_reset r restart", "restart r"]


def test_a_return_without_a_start_time_is_left_to_the_feed_of_an_exact_replica() -> None:
    exact, said_exact, _ = owner(exact=True)
    exact.returned_unknown("r")
    learned, said_learned, _ = owner(exact=False)
    learned.returned_unknown("r")
    assert said_exact == [] and said_learned == ["restart r"]


def test_a_gap_resets_the_model_only() -> None:
    restarts, said, feed = owner()
    restarts.gap("r")
    restarts.detach("r")
    restarts.started("r")
    assert said == ["kv_reset r gap", "restart r"] and feed.epochs == 0
