"""Capacity calibration and accuracy of the cache model, per replica, from reported cached tokens.

A replica's modelled tiers are sized from what it reports (its KV pool, its host pool), but the engine
keeps less than that for prefixes (running requests pin pages, fragmentation, other tenants' traffic the
gateway never saw). Each replica has a GPU and a host *effective-capacity factor* in (0, 1] that scales
its modelled tiers (``routing.cache_model``). Each settled request compares the tokens the model
predicted it would find cached (``gpu`` then ``host``, in engine tokens) with what the engine reported:

- reported + tolerance < min(predicted, confirmed): the model kept blocks the engine had evicted (only
  blocks that were already real when the request was routed count, ``confirmed``: a shortfall on blocks
  another in-flight request was still computing is not a capacity error). The factor of the tier where
  the prediction broke shrinks: ``factor *= 1 - GAIN x missing fraction`` (GPU when the report is below
  the GPU prediction, else host);
- reported > predicted + tolerance: the model was pessimistic: both factors grow back toward 1 by
  ``GAIN x (1 - factor)``.

``learn`` returns whether a factor moved (the cache model then resizes). Every settled request with a
report also adds |predicted - reported| to the replica's accuracy statistics (engine tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.types import ReplicaId

GAIN = 0.25  # learning gain of the effective-capacity factors
MIN_FACTOR = 0.05


@dataclass(frozen=True, slots=True)
class AccuracyStats:
    """How well the model predicted one replica's reported ``cached_tokens``."""

    requests: int
    mean_abs_error_tokens: float
    error_ratio: float  # sum |predicted - actual| / sum prompt tokens
    mean_predicted_tokens: float
    mean_actual_tokens: float
    gpu_factor: float
    host_factor: float
    abs_error_tokens: float = 0.0  # sum |predicted - actual| (engine tokens), to pool replicas
    prompt_tokens: float = 0.0  # sum of reported prompt tokens


@dataclass(frozen=True, slots=True)
class Sample:
    """One settled request: predicted tokens per tier, the part on confirmed blocks, and the report."""

    gpu: float
    host: float  # host + storage
    confirmed: float
    actual: float
    prompt: float
    tolerance: float


@dataclass(slots=True)
class _Replica:
    gpu_factor: float = 1.0
    host_factor: float = 1.0
    requests: int = 0
    abs_error: float = 0.0
    prompt: float = 0.0
    predicted: float = 0.0
    actual: float = 0.0


class Calibration:
    """Effective-capacity factors and accuracy statistics per replica (see the module docstring)."""

    def __init__(self) -> None:
        self._replicas: dict[ReplicaId, _Replica] = {}

    def factors(self, replica: ReplicaId) -> tuple[float, float]:
        r = self._replicas.get(replica)
        return (r.gpu_factor, r.host_factor) if r is not None else (1.0, 1.0)

    def forget(self, replica: ReplicaId) -> None:
        self._replicas.pop(replica, None)

    def learn(self, replica: ReplicaId, s: Sample, adjust: bool = True) -> bool:
        """Accounts one sample and moves the factors (not with ``adjust`` False: a replica in exact mode,
        whose tiers its KV events size); True when they changed."""
        r = self._replicas.setdefault(replica, _Replica())
        predicted = s.gpu + s.host
        r.requests += 1
        r.abs_error += abs(predicted - s.actual)
        r.prompt += s.prompt
        r.predicted += predicted
        r.actual += s.actual
        if not adjust:
            return False
        if s.actual + s.tolerance < min(predicted, s.confirmed):
            return _shrink(r, s, predicted)
        if s.actual > predicted + s.tolerance and (r.gpu_factor < 1.0 or r.host_factor < 1.0):
            r.gpu_factor = min(1.0, r.gpu_factor + GAIN * (1.0 - r.gpu_factor))
            r.host_factor = min(1.0, r.host_factor + GAIN * (1.0 - r.host_factor))
            return True
        return False

    def accuracy(self) -> dict[ReplicaId, AccuracyStats]:
        return {rid: _stats(r) for rid, r in self._replicas.items() if r.requests}


def _shrink(r: _Replica, s: Sample, predicted: float) -> bool:
    if s.actual + s.tolerance < s.gpu:
        r.gpu_factor = max(MIN_FACTOR, r.gpu_factor * (1.0 - GAIN * (s.gpu - s.actual) / s.gpu))
    elif s.host > 0:
        missing = min(1.0, (predicted - s.actual) / s.host)
        r.host_factor = max(MIN_FACTOR, r.host_factor * (1.0 - GAIN * missing))
    return True


def _stats(r: _Replica) -> AccuracyStats:
    n = max(1, r.requests)
    return AccuracyStats(
        requests=r.requests,
        mean_abs_error_tokens=r.abs_error / n,
        error_ratio=r.abs_error / r.prompt if r.prompt else 0.0,
        mean_predicted_tokens=r.predicted / n,
        mean_actual_tokens=r.actual / n,
        gpu_factor=r.gpu_factor,
        host_factor=r.host_factor,
        abs_error_tokens=r.abs_error,
        prompt_tokens=r.prompt,
    )
