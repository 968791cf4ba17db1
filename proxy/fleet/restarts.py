"""One owner of "this replica restarted": every detector reports here, and the cache model is reset once
per real restart, never after the replica's own KV events have rebuilt it.

Detectors, and what each proves:

- **the KV-event feed** (``proxy/sync/kv_feed.py``): the publisher's sequence went back (a new process
  counts from 0). The model of that replica is reset at once (``Router.kv_reset``) and the feed replays
  the new publisher's batches from 0, so the view is rebuilt from the truth within a replay round trip;
- **the replica's start time** (``/server_info`` ``startup_time``, read by the fleet when the replica
  comes back or every ``INFO_REFRESH_CHECKS`` health checks): a new process, seen up to a minute late on
  a fast restart that never failed a health check. If the feed already reset and rebuilt the view for
  this restart (its mark is younger than ``FEED_MARK_S``), nothing is reset again: that second reset was
  the bug that left a restarted replica at ~0 tokens for good. Otherwise the replica's GPU and host tiers
  are dropped (``Router.restart``) and its feed, if any, is told to start a new epoch (replay from 0);
- **a return after a health flap without a start time** (a replica that reports none): a restart cannot
  be ruled out. A replica whose view follows its own events is left to its feed (which sees a restart
  when there was one); any other is reset.

A cache flush asked through the admin API is not a restart but empties the same tiers: it goes to the
router directly (``proxy/admin/control.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from routing.types import ReplicaId

log = logging.getLogger("kvroute.fleet")
FEED_MARK_S = 300.0  # a feed's restart counts for the start-time change seen up to this long after it


class Epochs(Protocol):
    """A replica's KV-event feed, told that its publisher is a new process."""

    def new_epoch(self) -> None: ...


class Restarts:
    """The owner (module docstring); ``restart`` and ``kv_reset`` are the Router's, ``exact`` tells
    whether a replica's view follows its own KV events."""

    def __init__(
        self,
        restart: Callable[[ReplicaId], None],
        kv_reset: Callable[[ReplicaId, str], None],
        exact: Callable[[ReplicaId], bool],
    ) -> None:
        self._restart, self._kv_reset, self._exact = restart, kv_reset, exact
        self._feeds: dict[ReplicaId, Epochs] = {}
        self._marks: dict[ReplicaId, float] = {}  # replica -> when its feed last saw a publisher restart
        self.counts = {"restarts": 0, "rebuilt_by_events": 0}

    def attach(self, replica: ReplicaId, feed: Epochs) -> None:
        self._feeds[replica] = feed

    def detach(self, replica: ReplicaId) -> None:
        self._feeds.pop(replica, None)

    def publisher_restarted(self, replica: ReplicaId) -> None:
        """The feed saw the sequence go back: reset now; the feed rebuilds from the new publisher."""
        self._marks[replica] = time.monotonic()
        self._kv_reset(replica, "restart")

    def gap(self, replica: ReplicaId) -> None:
        """The feed lost batches it could not replay: the view is reset and rebuilt from what follows."""
        self._kv_reset(replica, "gap")

    def started(self, replica: ReplicaId) -> None:
        """The replica reports a new start time."""
        self.counts["restarts"] += 1
        mark = self._marks.pop(replica, None)
        if mark is not None and time.monotonic() - mark < FEED_MARK_S:
            self.counts["rebuilt_by_events"] += 1
            log.info("replica %s restarted: its KV events already rebuilt the view, kept", replica)
            return
        log.info("replica %s restarted: dropping its GPU and host tiers", replica)
        self._reset(replica)

    def returned_unknown(self, replica: ReplicaId) -> None:
        """The replica came back after failing health checks and reports no start time."""
        if self._exact(replica):
            return  # its feed sees a restart if there was one
        log.info("replica %s returned without a start time: assuming a restart", replica)
        self._reset(replica)

    def _reset(self, replica: ReplicaId) -> None:
        self._restart(replica)
        feed = self._feeds.get(replica)
        if feed is not None:
            feed.new_epoch()
