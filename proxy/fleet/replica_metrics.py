"""The replicas' own Prometheus metrics, scraped in the background and kept for /metrics and /status.

``ReplicaScraper.run(upstream)`` is a task of its own (started by ``proxy.status.observers.observe_ctx``):
every ``interval_s`` it sends ``GET /metrics`` to every healthy replica at once, each with a ``timeout_s``
bound, and never touches a request's path: a slow or dead replica costs the scraper one timeout, nothing
else waits for it. Per replica it keeps:

- the latest ``Scraped`` sample: the SGLang gauges of ``GAUGES`` (contract §5.1) and the cumulative
  counters ``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total{cache_source}`` (§5.2);
- a window of samples no older than ``window_s``, from which the hit ratio per tier is
  ``(cached[tier]_now - cached[tier]_oldest) / (prompt_now - prompt_oldest)`` for tier in device, host,
  storage (a counter that went down means the replica restarted: the window starts again);
- its ``ScrapeState``: whether it serves metrics at all (a 404 is a replica started without
  ``--enable-metrics``: ``enabled`` False, not an error), the time of the last good scrape, the count of
  failed scrapes and the last failure.

Parsing: only lines that start with a wanted name are handed to prometheus-client's text parser, so a
replica's hundreds of histogram lines cost one ``startswith`` each. SGLang labels its scheduler gauges
per rank; the value kept is, per ``dp_rank``, the largest sample (TP ranks report the same figures),
summed over dp ranks for counts and tokens, and the largest over dp ranks for ratios.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from proxy.errors import UpstreamError
from proxy.upstream.client import Upstream

log = logging.getLogger("kvroute.replica_metrics")

GAUGES = (
    "num_running_reqs",
    "num_queue_reqs",
    "num_used_tokens",
    "max_total_num_tokens",
    "token_usage",
    "cache_hit_rate",
    "gen_throughput",
    "hicache_host_used_tokens",
    "hicache_host_total_tokens",
    "new_token_ratio",
)
RATIOS = frozenset({"token_usage", "cache_hit_rate", "new_token_ratio"})
TIERS = ("device", "host", "storage")
PROMPT, CACHED = "prompt_tokens_total", "cached_tokens_total"
_NAMES = (*GAUGES, PROMPT, CACHED)
_PREFIXES = tuple(f"sglang:{n}{end}" for n in _NAMES for end in ("{", " "))
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 10.0
MAX_TIMEOUT_S = 2.0
WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Scraped:
    """One good scrape of one replica (``at``: the event loop's monotonic clock)."""

    at: float
    gauges: dict[str, float]
    prompt_tokens: float
    cached_tokens: dict[str, float]  # by cache_source


@dataclass(slots=True)
class ScrapeState:
    enabled: bool | None = None  # None: not scraped yet; False: /metrics answered 404
    last_ok: float | None = None
    errors: int = 0
    last_error: str | None = None
    duration_s: float = 0.0
    window: deque[Scraped] = field(default_factory=deque)

    @property
    def latest(self) -> Scraped | None:
        return self.window[-1] if self.window else None


def scrape_interval(health_interval_s: float) -> float:
    """The scrape period: the health-check period, bounded to [0.5 s, 10 s]."""
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, health_interval_s))


def _rank_value(values: dict[str, list[float]], ratio: bool) -> float:
    per_dp = [max(v) for v in values.values()]
    return max(per_dp) if ratio else sum(per_dp)


def parse(text: str, at: float) -> Scraped:
    """The wanted series of a Prometheus text exposition (see the module docstring)."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_PREFIXES))
    ranks: dict[str, dict[str, list[float]]] = {}
    cached: dict[str, float] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for s in family.samples:
            name = s.name.removeprefix("sglang:")
            if name == CACHED:
                source = s.labels.get("cache_source", "device")
                cached[source] = cached.get(source, 0.0) + s.value
            else:
                ranks.setdefault(name, {}).setdefault(s.labels.get("dp_rank", ""), []).append(s.value)
    gauges = {n: _rank_value(ranks[n], n in RATIOS) for n in GAUGES if n in ranks}
    prompt = sum(sum(v) for v in ranks.get(PROMPT, {}).values())
    return Scraped(at, gauges, prompt, cached)


class ReplicaScraper:
    """See the module docstring. ``replicas`` lists the fleet as (id, healthy): the healthy ones are
    scraped; the others keep their last figures (with their growing age) until they leave the fleet."""

    def __init__(
        self,
        replicas: Callable[[], Iterable[tuple[str, bool]]],
        interval_s: float = MAX_INTERVAL_S,
        timeout_s: float | None = None,
        window_s: float = WINDOW_S,
        on_sample: Callable[[str, Scraped], None] | None = None,
    ) -> None:
        self._replicas = replicas
        self.on_sample = on_sample  # told of every good scrape (the fleet takes new_token_ratio from it)
        self.interval_s, self.timeout_s = interval_s, timeout_s or min(MAX_TIMEOUT_S, interval_s)
        self.window_s = window_s
        self.states: dict[str, ScrapeState] = {}

    def set_interval(self, interval_s: float) -> None:
        """Scrape every ``interval_s``; each scrape waits at most min(2 s, interval)."""
        self.interval_s, self.timeout_s = interval_s, min(MAX_TIMEOUT_S, interval_s)

    async def run(self, upstream: Upstream) -> None:
        """Scrapes every ``interval_s`` until cancelled."""
        while True:
            await self.scrape_all(upstream)
            await asyncio.sleep(self.interval_s)

    async def scrape_all(self, upstream: Upstream) -> None:
        fleet = dict(self._replicas())
        for gone in [r for r in self.states if r not in fleet]:
            del self.states[gone]
        await asyncio.gather(*(self.scrape(upstream, r) for r, healthy in fleet.items() if healthy))

    async def scrape(self, upstream: Upstream, replica: str) -> None:
        state = self.states.setdefault(replica, ScrapeState())
        t0 = time.monotonic()
        try:
            status, body = await upstream.call(replica, "GET", "/metrics", self.timeout_s)
            state.duration_s = time.monotonic() - t0
            if status == 404:
                state.enabled, state.last_error = False, None
                state.window.clear()
                return
            if status != 200:
                raise UpstreamError(f"/metrics returned HTTP {status}")
            self.record(replica, parse(body.decode("utf-8", "replace"), time.monotonic()))
        except (UpstreamError, ValueError) as e:
            state.errors += 1
            state.last_error = e.message if isinstance(e, UpstreamError) else f"unparsable /metrics: {e}"
            state.duration_s = time.monotonic() - t0
            log.debug("scrape of %s failed: %s", replica, state.last_error)

    def record(self, replica: str, new: Scraped) -> None:
        """Keeps a good scrape: the latest sample, and the window (restarted when a counter went down)."""
        state = self.states.setdefault(replica, ScrapeState())
        state.enabled, state.last_ok, state.last_error = True, new.at, None
        w = state.window
        if w and (new.prompt_tokens < w[-1].prompt_tokens or _went_down(w[-1].cached_tokens, new)):
            w.clear()  # the replica restarted: its counters began again
        w.append(new)
        while len(w) > 2 and new.at - w[1].at >= self.window_s:
            w.popleft()
        if self.on_sample is not None:
            self.on_sample(replica, new)

    def age_s(self, replica: str, now: float | None = None) -> float | None:
        """Seconds since the replica's last good scrape; None before the first."""
        state = self.states.get(replica)
        if state is None or state.last_ok is None:
            return None
        return (time.monotonic() if now is None else now) - state.last_ok

    def hit_ratio(self, replica: str) -> dict[str, float] | None:
        """Per tier, cached tokens / prompt tokens over the window; None until two samples differ."""
        state = self.states.get(replica)
        if state is None or len(state.window) < 2:
            return None
        old, new = state.window[0], state.window[-1]
        prompt = new.prompt_tokens - old.prompt_tokens
        if prompt <= 0:
            return None
        return {t: (new.cached_tokens.get(t, 0.0) - old.cached_tokens.get(t, 0.0)) / prompt for t in TIERS}


def _went_down(before: dict[str, float], new: Scraped) -> bool:
    return any(new.cached_tokens.get(t, 0.0) < v for t, v in before.items())
