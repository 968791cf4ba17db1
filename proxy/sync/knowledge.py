"""How much the gateway's picture of each replica can be trusted: ``exact``, ``learned`` or ``degraded``,
with the reason, on ``/status`` (``knowledge`` and ``warnings``), the status page, ``kvroute status``
and ``/metrics`` (``kvroute_replica_knowledge{replica,state}``, one-hot).

- ``exact``: the replica's KV events flow and the model follows them (``routing.exact``);
- ``learned``: no events are used (none published, ``--kv-events off``, no tokenizer), the model learns
  from what requests report: a known, working mode, not a fault;
- ``degraded``, the first that holds of:
  1. the replica is out of the pool (its last error);
  2. its events cannot be subscribed to (the socket's error: a port another gateway holds, say);
  3. subscribed, but no batch came although ``MIN_REQUESTS`` requests went there, the first of them
     ``NO_BATCH_S`` ago or more (an endpoint nothing publishes on, a hybrid replica that publishes
     none), or batches stopped: the last came ``NO_BATCH_S`` before the last request;
  4. exact, and over the window the gateway's prompt token counts differ from the replica's by more
     than ``TOKENS_BOUND`` (the gateway's tokenizer is not the replica's: with a tokenizer the counts
     are exact);
  5. exact, and over the window the predicted cached tokens differ from the reported ones by more than
     ``ERROR_BOUND`` of the prompt tokens (``--kv-events on`` on text prompts keyed by characters).

The window is the replica's requests of the last ``WINDOW_S`` seconds (at most the history's ring).
Each degraded replica is said as a WARNING once, then at most once a minute while it lasts
(``proxy.observe.said``), and cleared when it ends; ``evaluate`` runs every ``EVERY_S`` in the
background, so a fault is logged whether or not anyone reads ``/status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.context import Gateway
from proxy.fleet.replica import Replica
from proxy.observe.history import Outcome
from proxy.observe.said import Said
from routing.exact import KvMode

log = logging.getLogger("kvroute.knowledge")
WINDOW_S = 300.0
MIN_REQUESTS = 3
MIN_SAMPLES = 5
NO_BATCH_S = 10.0
TOKENS_BOUND = 0.02
ERROR_BOUND = 0.05
EVERY_S = 2.0
STATES = ("exact", "learned", "degraded")


@dataclass(frozen=True, slots=True)
class Window:
    requests: int  # answered with usage, in the window
    error_ratio: float | None  # sum |predicted - reported cached| / sum prompt
    tokens_ratio: float | None  # sum |gateway - replica prompt tokens| / sum replica prompt tokens


@dataclass(frozen=True, slots=True)
class Knowledge:
    state: str
    reason: str
    window: Window


class Feeds(Protocol):
    """What the KV-event subscriptions tell of one replica (``proxy/sync/kv_subscriber.py``)."""

    def subscribed(self, replica: str) -> str | None: ...  # the endpoint, when subscribed

    def subscribe_error(self, replica: str) -> str | None: ...

    def batches(self, replica: str) -> tuple[int, float]: ...  # (live batches, wall time of the last)


def window(outcomes: Sequence[Outcome]) -> Window:
    used = [o for o in outcomes if o.prompt_tokens and o.cached_tokens is not None]
    prompt = sum(o.prompt_tokens or 0 for o in used)
    if not used or not prompt:
        return Window(len(used), None, None)
    err = sum(abs(o.predicted_cached_tokens - (o.cached_tokens or 0)) for o in used) / prompt
    counted = [o for o in used if o.predicted_prompt_tokens is not None]
    tokens = sum(abs((o.predicted_prompt_tokens or 0) - (o.prompt_tokens or 0)) for o in counted)
    return Window(len(used), err, tokens / prompt if counted else None)


def _feed_trouble(feeds: Feeds, rid: str, outcomes: Sequence[Outcome], now: float) -> str | None:
    """Rules 2 and 3 of the module docstring."""
    error = feeds.subscribe_error(rid)
    if error is not None:
        return f"cannot subscribe to its KV events: {error}"
    endpoint = feeds.subscribed(rid)
    if endpoint is None or len(outcomes) < MIN_REQUESTS:
        return None
    batches, last = feeds.batches(rid)
    if not batches and now - outcomes[0].at >= NO_BATCH_S:
        return f"subscribed to {endpoint}, but no KV event batch after {len(outcomes)} requests"
    if batches and outcomes[-1].at - last >= NO_BATCH_S and now - outcomes[-1].at >= 1.0:
        return f"KV events from {endpoint} stopped {now - last:.0f} s ago, {len(outcomes)} requests since"
    return None


def _model_trouble(w: Window, exact_tokens: bool) -> str | None:
    """Rules 4 and 5 of the module docstring."""
    if w.requests < MIN_SAMPLES:
        return None
    if exact_tokens and w.tokens_ratio is not None and w.tokens_ratio > TOKENS_BOUND:
        return (
            f"tokenizer mismatch: the gateway's prompt token counts differ from the replica's by "
            f"{w.tokens_ratio:.1%} over {w.requests} requests (--tokenizer-path must be the replicas' model)"
        )
    if w.error_ratio is not None and w.error_ratio > ERROR_BOUND:
        bound = f"bound {ERROR_BOUND:.0%}"
        return f"cache model error {w.error_ratio:.1%} over the last {w.requests} requests ({bound})"
    return None


def judge(
    r: Replica, mode: KvMode, feeds: Feeds, outcomes: Sequence[Outcome], exact_tokens: bool
) -> Knowledge:
    """One replica's knowledge (the rules of the module docstring)."""
    w, now = window(outcomes), time.time()
    if not r.healthy:
        return Knowledge("degraded", f"out of the pool ({r.last_error or 'failing health checks'})", w)
    trouble = _feed_trouble(feeds, r.id, outcomes, now)
    if trouble is None and mode.mode == "exact":
        trouble = _model_trouble(w, exact_tokens)
    if trouble is not None:
        return Knowledge("degraded", trouble, w)
    return Knowledge(mode.mode, mode.why, w)


class KnowledgeWatch:
    """Judges every replica, says the degraded ones, and serves /status and /metrics."""

    def __init__(self, gw: Gateway, feeds: Feeds) -> None:
        self.gw, self.feeds = gw, feeds
        self.said = Said(log)
        self.latest: dict[str, Knowledge] = {}

    def evaluate(self) -> dict[str, Knowledge]:
        gw, since = self.gw, time.time() - WINDOW_S
        exact_tokens = gw.tokenizer is not None
        self.latest = {
            r.id: judge(
                r, gw.router.kv_mode(r.id), self.feeds, gw.metrics.history.recent(r.id, since), exact_tokens
            )
            for r in gw.fleet.replicas()
        }
        for rid, k in self.latest.items():
            if k.state == "degraded":
                self.said.warn(rid, f"replica {rid}: the gateway's view is degraded: {k.reason}")
            else:
                self.said.clear(rid)
        for gone in set(self.said.active()) - set(self.latest):
            self.said.clear(gone)
        return self.latest

    def status(self) -> dict[str, Any]:
        return {
            rid: {"state": k.state, "reason": k.reason, "window": vars_of(k.window)}
            for rid, k in self.evaluate().items()
        }

    def warnings(self) -> list[str]:
        return [
            f"{rid}: the gateway's view is degraded: {k.reason}"
            for rid, k in self.latest.items()
            if k.state == "degraded"
        ]

    async def run(self) -> None:
        while True:
            self.evaluate()
            await asyncio.sleep(EVERY_S)


def vars_of(w: Window) -> dict[str, Any]:
    return {"requests": w.requests, "error_ratio": w.error_ratio, "tokens_ratio": w.tokens_ratio}


class KnowledgeCollector(Collector):
    """kvroute_replica_knowledge{replica,state}: 1 for the replica's current state, 0 for the others."""

    def __init__(self, watch: KnowledgeWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "kvroute_replica_knowledge",
            "The gateway's view of a replica: exact, learned or degraded",
            labels=["replica", "state"],
        )
        for rid, k in self._watch.evaluate().items():
            for state in STATES:
                g.add_metric([rid, state], float(k.state == state))
        yield g
