"""Builds the policy named by a ``RoutingConfig``: one ``Pipeline`` per name.

The ``Router`` calls ``build_policy(cfg, rates)`` once; adding a policy means adding one entry here.
Every policy sees the same candidates (the cache model's matches included) and the same learned rates;
prefix-blind ones simply do not look at them, and ``cache_aware`` keeps its own approximate tree, as
sglang-router does. Policies are imported when built, so a policy module that fails to import breaks
only that policy (with its ImportError), never the gateway.
"""

from __future__ import annotations

from collections.abc import Callable

from routing.config import POLICY_NAMES, RoutingConfig
from routing.pipeline import Pipeline
from routing.rates import RateBook


def _cost(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    from routing.policies.cost import cost

    return cost(cfg, rates)


def _round_robin(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    from routing.policies.round_robin import round_robin

    return round_robin()


def _least_load(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    from routing.policies.least_load import least_load

    return least_load(cfg)


def _cache_aware(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    from routing.policies.cache_aware import cache_aware

    return cache_aware(cfg)


def _consistent_hash(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    from routing.policies.consistent_hash import consistent_hash

    return consistent_hash(cfg)


_POLICIES: dict[str, Callable[[RoutingConfig, RateBook], Pipeline]] = {
    "cost": _cost,
    "round_robin": _round_robin,
    "least_load": _least_load,
    "cache_aware": _cache_aware,
    "consistent_hash": _consistent_hash,
}


def available_policies() -> tuple[str, ...]:
    return tuple(name for name in POLICY_NAMES if name in _POLICIES)


def build_policy(cfg: RoutingConfig, rates: RateBook) -> Pipeline:
    """The policy named by ``cfg.policy``; ValueError for a name that is not implemented."""
    make = _POLICIES.get(cfg.policy)
    if make is None:
        raise ValueError(
            f"routing policy {cfg.policy!r} is not implemented in this build; "
            f"available: {', '.join(available_policies())}"
        )
    return make(cfg, rates)
