"""What the gateway saw recently, in bounded ring buffers: routing decisions and each replica's requests.

Every finished attempt (``GatewayMetrics.attempt_done``, called once per attempt from
``proxy/dispatch/forward.py``) appends one ``Outcome``:

- to the fleet-wide ring of the last ``DECISIONS`` decisions (newest last): time, route, replica, reason,
  predicted TTFT and cached tokens, what the replica reported (TTFT, prompt and cached tokens);
- to its replica's ring of the last ``PER_REPLICA`` outcomes, from which ``/status`` draws the recent
  TTFTs (the sparkline) and the gateway-side hit ratio over those requests:
  ``hit = sum cached_tokens / sum prompt_tokens`` over the outcomes that reported both.

Nothing here holds prompt text or request ids: only replica ids, route and reason names, numbers. Rings of
replicas that left the fleet are dropped by ``retain``, so memory is bounded by
``DECISIONS + PER_REPLICA x replicas`` outcomes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

DECISIONS = 100
PER_REPLICA = 64


class Outcome(NamedTuple):
    """One finished attempt on one replica (times in seconds; ``at`` is wall-clock epoch seconds). A
    NamedTuple: one is built per request, and a frozen dataclass of ten fields costs 4x more to build."""

    at: float
    route: str
    replica: str
    reason: str
    ok: bool
    predicted_ttft_s: float
    predicted_cached_tokens: float
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    predicted_prompt_tokens: int | None = None  # the gateway's count (exact with its tokenizer)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class History:
    """The rings described in the module docstring."""

    def __init__(self, decisions: int = DECISIONS, per_replica: int = PER_REPLICA) -> None:
        self._decisions: deque[Outcome] = deque(maxlen=decisions)
        self._per_replica = per_replica
        self._replicas: dict[str, deque[Outcome]] = {}

    def add(self, o: Outcome) -> None:
        self._decisions.append(o)
        ring = self._replicas.get(o.replica)
        if ring is None:
            ring = self._replicas[o.replica] = deque(maxlen=self._per_replica)
        ring.append(o)

    def decisions(self) -> list[Outcome]:
        """The recent decisions, newest first."""
        return list(reversed(self._decisions))

    def recent(self, replica: str, since: float) -> list[Outcome]:
        """The replica's outcomes at or after wall time ``since``, oldest first."""
        return [o for o in self._replicas.get(replica, ()) if o.at >= since]

    def count(self, replica: str) -> int:
        """How many outcomes the replica's ring holds (at most ``PER_REPLICA``)."""
        return len(self._replicas.get(replica, ()))

    def ttfts(self, replica: str) -> list[float]:
        """The replica's recent measured TTFTs (seconds), oldest first (requests with a first byte)."""
        return [o.ttft_s for o in self._replicas.get(replica, ()) if o.ttft_s is not None]

    def hit_ratio(self, replica: str) -> float | None:
        """Sum of reported cached tokens / sum of prompt tokens over the replica's recent outcomes."""
        reported = [
            o for o in self._replicas.get(replica, ()) if o.prompt_tokens and o.cached_tokens is not None
        ]
        prompt = sum(o.prompt_tokens or 0 for o in reported)
        return sum(o.cached_tokens or 0 for o in reported) / prompt if prompt else None

    def retain(self, replicas: Iterable[str]) -> None:
        """Drops the rings of replicas no longer in the fleet (the decision ring keeps them)."""
        keep = set(replicas)
        for gone in [r for r in self._replicas if r not in keep]:
            del self._replicas[gone]
