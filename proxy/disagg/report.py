"""What the gateway says of its prefill/decode fleet: metrics and the ``pd`` section of ``/status``.

Metrics (beside the per-replica families every replica has, decode servers included):

kvroute_pd_pairs_total{outcome}          requests sent to pairs: answered, answered_after_retry, failed
kvroute_pd_pair_failures_total{side}     pair attempts that failed before the client's first byte, by the
                                         side that failed first (prefill, decode): each one retried
kvroute_pd_replicas{role}                healthy replicas per role (unified, prefill, decode)

``/status["pd"]``: whether the fleet is disaggregated, the replicas of each role (healthy or not, with
each prefill's bootstrap port), the unified replicas left idle beside PD servers of their model
(mixed fleets: docs/pd.md) and the counters above. Each replica's own entry in ``/status["replicas"]``
carries its ``role`` too (``proxy/fleet/replica.py``).
"""

from __future__ import annotations

from typing import Any

from proxy.context import Gateway
from proxy.fleet.roles import ROLES
from proxy.observe.exposition import FastCounter


class PdReport:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        m = gw.metrics
        self._pairs = m.add(
            FastCounter("kvroute_pd_pairs", "Requests sent to prefill/decode pairs", ("outcome",))
        )
        self._failures = m.add(
            FastCounter("kvroute_pd_pair_failures", "Pair attempts failed before the first byte", ("side",))
        )
        self.counts: dict[str, dict[str, int]] = {"pairs": {}, "pair_failures": {}}
        m.register_source("pd_replicas", self.healthy, "Healthy replicas per role", "role")
        m.register_section("pd", self.status)

    def pair(self, outcome: str) -> None:
        self._pairs.labels(outcome).inc()
        self.counts["pairs"][outcome] = self.counts["pairs"].get(outcome, 0) + 1

    def failure(self, side: str) -> None:
        self._failures.labels(side).inc()
        self.counts["pair_failures"][side] = self.counts["pair_failures"].get(side, 0) + 1

    def healthy(self) -> dict[str, float]:
        out: dict[str, float] = dict.fromkeys(ROLES, 0.0)
        for r in self.gw.fleet.replicas():
            out[r.role] += float(r.healthy)
        return out

    def status(self) -> dict[str, Any]:
        by_role: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
        for r in self.gw.fleet.replicas():
            if r.role in by_role:
                entry: dict[str, Any] = {"id": r.id, "healthy": r.healthy, "draining": r.draining}
                if r.role == "prefill":
                    entry["bootstrap_port"] = r.bootstrap_port
                by_role[r.role].append(entry)
        return {
            "disaggregated": any(by_role.values()),
            **by_role,
            "idle_unified": self.gw.fleet.idle_unified(),
            **{k: dict(v) for k, v in self.counts.items()},
        }
