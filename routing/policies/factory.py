"""Builds the policy and the prefix index named by a ``RoutingConfig``.

The proxy calls ``build_policy(cfg)`` and ``build_prefix_index(cfg)`` once at start-up; adding a policy
means adding one entry here. Policies are imported when built, so a policy module that fails to import
breaks only that policy (with its ImportError), never the gateway. Prefix-aware policies get the tiered
``CacheModel``; prefix-blind ones (and ``cache_aware``, which keeps its own approximate tree, as
sglang-router does) get the ``NullPrefixIndex``.
"""

from __future__ import annotations

from collections.abc import Callable

from routing.config import POLICY_NAMES, RoutingConfig
from routing.pipeline import NullPrefixIndex, Policy, PrefixIndex
from routing.policies.least_load import LeastLoadPolicy
from routing.policies.round_robin import RoundRobinPolicy


def _cost(cfg: RoutingConfig) -> Policy:
    from routing.policies.cost import CostPolicy

    return CostPolicy(cfg)


def _cache_aware(cfg: RoutingConfig) -> Policy:
    from routing.policies.cache_aware import CacheAwarePolicy

    return CacheAwarePolicy(cfg)


def _consistent_hash(cfg: RoutingConfig) -> Policy:
    from routing.policies.consistent_hash import ConsistentHashPolicy

    return ConsistentHashPolicy(cfg)


_POLICIES: dict[str, Callable[[RoutingConfig], Policy]] = {
    "cost": _cost,
    "round_robin": lambda cfg: RoundRobinPolicy(),
    "least_load": LeastLoadPolicy,
    "cache_aware": _cache_aware,
    "consistent_hash": _consistent_hash,
}
_USES_CACHE_MODEL = frozenset(POLICY_NAMES)  # every policy: the model's accuracy is a metric everywhere


def available_policies() -> tuple[str, ...]:
    return tuple(name for name in POLICY_NAMES if name in _POLICIES)


def build_policy(cfg: RoutingConfig) -> Policy:
    """The policy named by ``cfg.policy``; ValueError for a name that is not implemented."""
    make = _POLICIES.get(cfg.policy)
    if make is None:
        raise ValueError(
            f"routing policy {cfg.policy!r} is not implemented in this build; "
            f"available: {', '.join(available_policies())}"
        )
    return make(cfg)


def build_prefix_index(cfg: RoutingConfig) -> PrefixIndex:
    """The cache model the policy consults; prefix-blind policies get an index that knows nothing."""
    if cfg.policy in _USES_CACHE_MODEL:
        from routing.cache_model import CacheModel

        return CacheModel(cfg)
    return NullPrefixIndex()
