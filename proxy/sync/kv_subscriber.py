"""The gateway's KV-event subscriptions: one ``proxy.sync.kv_feed.KvFeed`` per replica that publishes events.

With ``--kv-events auto`` (the default) and a tokenizer (``--tokenizer-path``), or with ``on``, every
replica whose ``/get_server_info`` reports a
``kv_events_config`` with publisher ``zmq`` gets a SUB on its endpoint (a wildcard host means the
replica's own host, ``proxy.sync.kv_link.connect_endpoint``), and its batches go to
``Router.apply_kv_events``: the replica's cache model runs in exact mode (``routing.exact``). The set
of subscriptions follows the fleet every ``RECONCILE_S``: a new replica (or a changed config) is
subscribed, a replica removed from the fleet has its sockets closed. ``--kv-events off`` subscribes to
nothing: every replica stays learned.

Without a tokenizer ``auto`` subscribes to nothing either: text prompts are then keyed by characters,
which the engine's page events cannot name, and the event-backed keys would fill the modelled tiers
and push the learned character blocks out (bench.exact's agent: the learned model's error went from
1.5% to 50% with the events on). ``on`` is for gateways whose traffic is token ids (``input_ids``,
token-id ``prompt``) without a tokenizer.

A socket that cannot be opened (a bind to a port another process holds, a malformed endpoint) is
tried again after a backoff (``RETRY_S``, doubling to ``RETRY_MAX_S``); the error is kept for
``/status`` and said by the knowledge watch, once, then at most once a minute. Each feed reports a
publisher restart to the restart owner (``proxy/fleet/restarts.py``) and is attached to it, so a
start-time change it did not see makes it start a new epoch.

``kv_events_ctx`` (a cleanup_ctx in ``proxy/server.py``) runs it, and the knowledge watch
(``proxy/sync/knowledge.py``) beside it. ``/status["kv_events"]`` shows per replica its mode (exact |
learned, and why), endpoint, batches, events, gaps, replays, resets, lag and decode errors; ``/metrics``
has them as ``kvroute_kv_events_<field>{replica}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.fleet.replica import Replica
from proxy.sync.knowledge import KnowledgeCollector, KnowledgeWatch
from proxy.sync.kv_feed import KvFeed, stop
from proxy.sync.kv_link import connect_endpoint, publisher_binds
from routing.kv_events import EventBatch
from routing.types import ReplicaId

log = logging.getLogger("kvroute.kv_events")
RECONCILE_S = 1.0
RETRY_S, RETRY_MAX_S = 1.0, 60.0
RETRIES_SAID = 3  # refused connection attempts before the feed is said to be failing
METRIC_FIELDS = ("batches", "events", "gaps", "replays", "resets", "decode_errors", "lag_s", "apply_s")


def publisher_config(text: str) -> Mapping[str, Any] | None:
    """A replica's ``kv_events_config`` (JSON) when it publishes over ZMQ, else None."""
    try:
        doc = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("publisher") != "zmq" or not isinstance(doc.get("endpoint"), str):
        return None
    return doc


class KvSubscriber:
    """Feeds by replica, reconciled with the fleet (see the module docstring)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.ctx = zmq.asyncio.Context()
        self.feeds: dict[ReplicaId, tuple[str, KvFeed, asyncio.Task[None]]] = {}
        self.errors: dict[ReplicaId, tuple[str, float, float]] = {}  # error, next try (loop time), backoff
        self._closing: set[asyncio.Task[None]] = set()

    def reconcile(self) -> None:
        """Subscribes new publishers, drops feeds of replicas gone or changed."""
        wanted = {r.id: r for r in self.gw.fleet.replicas() if self._config_text(r)}
        for rid in [rid for rid, (text, _, _) in self.feeds.items() if self._changed(wanted.get(rid), text)]:
            self._close_later(rid)
        for rid in [rid for rid in self.errors if rid not in wanted]:
            self._forget_error(rid)
        now = asyncio.get_running_loop().time()
        for rid, replica in wanted.items():
            if rid not in self.feeds and now >= self.errors.get(rid, ("", 0.0, 0.0))[1]:
                self._open(replica)

    async def run(self) -> None:
        while True:
            self.reconcile()
            await asyncio.sleep(RECONCILE_S)

    async def close(self) -> None:
        for rid in list(self.feeds):
            self._close_later(rid)
        await asyncio.gather(*self._closing, return_exceptions=True)
        self.ctx.destroy(linger=0)  # closes whatever is still open; term() alone could block

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for r in self.gw.fleet.replicas():
            mode = asdict(self.gw.router.kv_mode(r.id))
            entry = self.feeds.get(r.id)
            if entry is None:
                mode["why"] = mode["why"] if mode["mode"] == "exact" else self._why_not(r)
            else:
                if not mode["batches"] and mode["mode"] == "learned":
                    mode["why"] = "subscribed, no event batch yet"
                link = entry[1].link
                mode |= {"endpoint": entry[1].endpoint, "link": link.state, "connect_retries": link.retries}
                mode |= {"reconnects": link.reconnects} | asdict(entry[1].stats)
            out[r.id] = mode
        return out

    # ---- what the knowledge watch asks (proxy/sync/knowledge.py Feeds) -------------------------------
    def subscribed(self, replica: str) -> str | None:
        entry = self.feeds.get(replica)
        return entry[1].endpoint if entry is not None else None

    def subscribe_error(self, replica: str) -> str | None:
        """Why the feed cannot work: its socket did not open, or its connection is refused again and again."""
        error, entry = self.errors.get(replica), self.feeds.get(replica)
        if error is not None:
            return error[0]
        link = entry[1].link if entry is not None else None
        if link is not None and link.state == "connecting" and link.retries >= RETRIES_SAID:
            return f"connecting to {entry[1].endpoint} refused {link.retries} times"  # type: ignore[index]
        return None

    def batches(self, replica: str) -> tuple[int, float]:
        """Live batches received, and the wall time of the last one."""
        entry = self.feeds.get(replica)
        return (entry[1].stats.live_batches, entry[1].stats.last_live_at) if entry is not None else (0, 0.0)

    def metric(self, name: str) -> dict[str, float]:
        return {rid: float(getattr(feed.stats, name)) for rid, (_, feed, _) in self.feeds.items()}

    def exact(self) -> dict[str, float]:
        return {r.id: float(self.gw.router.kv_mode(r.id).mode == "exact") for r in self.gw.fleet.replicas()}

    # ---- internals ----------------------------------------------------------------------------------
    def _config_text(self, r: Replica) -> str:
        if not self._wanted() or r.info is None or r.role == "decode":  # a decode keeps no prefix cache
            return ""
        text = r.info.kv_events_config
        return text if publisher_config(text) is not None else ""

    def _changed(self, replica: Replica | None, text: str) -> bool:
        return replica is None or self._config_text(replica) != text

    def _wanted(self) -> bool:
        mode = self.gw.settings.kv_events
        return mode == "on" or (mode == "auto" and self.gw.settings.tokenizer_path is not None)

    def _why_not(self, r: Replica) -> str:
        if self.gw.settings.kv_events == "off":
            return "--kv-events off"
        if r.info is None or publisher_config(r.info.kv_events_config) is None:
            return "the replica publishes no KV events (no kv_events_config)"
        if not self._wanted():
            return "--kv-events auto without --tokenizer-path: text prompts are keyed by characters"
        error = self.errors.get(r.id)
        return f"cannot subscribe: {error[0]}" if error is not None else "not subscribed yet"

    def _open(self, r: Replica) -> None:
        text = self._config_text(r)
        cfg = publisher_config(text)
        assert cfg is not None and r.info is not None
        model, rid, router = r.info.served_model, r.id, self.gw.router
        replay = cfg.get("replay_endpoint")
        replay = connect_endpoint(replay, rid) if isinstance(replay, str) and replay else None

        def apply(batch: EventBatch) -> None:
            if not router.apply_kv_events(rid, batch, model):
                router.sync([r.state()])  # not routed to yet: the cache model learns of it first
                router.apply_kv_events(rid, batch, model)

        restarts = self.gw.fleet.restarts

        def reset(reason: str) -> None:
            (restarts.publisher_restarted if reason == "restart" else restarts.gap)(rid)

        endpoint, bind = connect_endpoint(cfg["endpoint"], rid), not publisher_binds(cfg["endpoint"])
        topic = str(cfg.get("topic") or "")

        def reconnected() -> None:
            self._reconnected(rid)

        try:
            feed = KvFeed(self.ctx, rid, endpoint, bind, replay, topic, apply, reset, reconnected)
        except zmq.ZMQError as exc:
            self._failed(rid, f"{'bind' if bind else 'connect'} {endpoint}: {exc}")
            return
        self._forget_error(rid)
        restarts.attach(rid, feed)
        self.feeds[rid] = (text, feed, asyncio.get_running_loop().create_task(feed.run()))
        how = "listening on" if bind else "connecting to"
        log.info("KV events of %s: %s %s (a batch or the replay confirms it)", rid, how, endpoint)

    def _reconnected(self, rid: ReplicaId) -> None:
        """The publisher came back: read the replica's start time now, not in up to a minute."""
        replica = self.gw.fleet.get(rid)
        if replica is not None:
            replica.info_stale = True
            self.gw.background.spawn(self.gw.fleet.check(self.gw.up, replica, refresh=True))

    def _failed(self, rid: ReplicaId, error: str) -> None:
        """A socket that did not open: kept for /status, said at a bounded rate, tried again later."""
        backoff = min(RETRY_MAX_S, 2 * self.errors[rid][2]) if rid in self.errors else RETRY_S
        self.errors[rid] = (error, asyncio.get_running_loop().time() + backoff, backoff)

    def _forget_error(self, rid: ReplicaId) -> None:
        self.errors.pop(rid, None)

    def _close_later(self, rid: ReplicaId) -> None:
        _, feed, task = self.feeds.pop(rid)
        self.gw.fleet.restarts.detach(rid)
        closing = asyncio.get_running_loop().create_task(stop(feed, task))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)


async def kv_events_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    sub = KvSubscriber(gw)
    app[KV_SUBSCRIBER] = sub
    gw.metrics.register_section("kv_events", sub.status)
    watch = app[KNOWLEDGE] = KnowledgeWatch(gw, sub)
    gw.metrics.register_section("knowledge", watch.status)
    gw.metrics.add(KnowledgeCollector(watch))
    gw.metrics.register_source("kv_exact", sub.exact, "1 when the replica's cache model is exact", "replica")
    for name in METRIC_FIELDS:
        help_ = f"KV-event feed per replica: {name} (proxy/sync/kv_feed.py FeedStats)"
        gw.metrics.register_source(f"kv_events_{name}", _reader(sub, name), help_, "replica")
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(sub.run()), loop.create_task(watch.run())]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sub.close()


def _reader(sub: KvSubscriber, name: str) -> Any:
    return lambda: sub.metric(name)


KV_SUBSCRIBER = web.AppKey("kv_subscriber", KvSubscriber)
KNOWLEDGE = web.AppKey("knowledge", KnowledgeWatch)
