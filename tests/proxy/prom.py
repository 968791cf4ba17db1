"""Reading a Prometheus text exposition in tests: every sample by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def samples(text: str) -> dict[str, dict[Labels, float]]:
    """{sample name: {sorted (label, value) pairs: value}} of every sample in ``text``."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` with exactly ``labels``, or None."""
    return samples(text).get(name, {}).get(tuple(sorted(labels.items())))


def by(text: str, name: str, label: str) -> dict[str, float]:
    """The samples of ``name`` keyed by one label's value (summed over the other labels)."""
    out: dict[str, float] = {}
    for labels, v in samples(text).get(name, {}).items():
        key = dict(labels).get(label, "")
        out[key] = out.get(key, 0.0) + v
    return out
