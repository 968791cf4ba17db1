"""The Prometheus text format (0.0.4) of the gateway's /metrics, written fast.

Why not ``prometheus_client.generate_latest`` alone: it validates and escapes every label name of every
sample and builds a ``Sample`` per line through each metric's ``collect``. For a gateway in front of 16
replicas (~2,000 samples, most of them the TTFT and duration histograms' buckets) that took 21 ms of CPU
per scrape, on the event loop that serves requests, against a 5 ms target (``bench/overhead/scrape.py``).

Here the families with many lines write them as text directly:

- ``TextFamily``: a family built at scrape time (``# HELP``/``# TYPE`` and one line per sample; label
  values escaped once per label set, names trusted: they are ours, and checked where others register);
- ``TextCollector``: a prometheus-client ``Collector`` whose ``text()`` gives its lines; its
  ``collect()`` parses them back, so a registry and ``generate_latest`` still see the same families
  (the tests compare the two outputs sample by sample);
- ``FastHistogram``: a labelled histogram (cumulative ``le`` buckets, ``_count``, ``_sum``) that keeps
  per label set its bucket counts and renders them with pre-formatted label strings.

``render(collectors)`` writes ``text()`` collectors as they are and any other collector (prometheus-client
counters, the process collector) through ``collect()`` with one f-string per sample. No ``_created``
series: the text format has no place for them (prometheus-client adds them as separate gauges, which
Prometheus stores as series of their own). Numbers are formatted as prometheus-client does
(``floatToGoString``), with a fast path for the small integers bucket counts mostly are.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Container, Iterable, Iterator, Sequence
from functools import lru_cache
from math import inf
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "unknown": "untyped"}
_SKIP = ("_created", "_gsum", "_gcount")


def escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


@lru_cache(maxsize=4096)
def labels_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``a="x",b="y"`` sorted by label name, as prometheus-client writes them (cached: label sets repeat
    from scrape to scrape)."""
    return ",".join(f'{n}="{escape(v)}"' for n, v in sorted(zip(names, values, strict=True)))


def go_float(x: float) -> str:
    """A float as prometheus-client (and Go) writes it: ``1.0``, ``+Inf``, ``1.5e+06``."""
    text: str = floatToGoString(x)  # type: ignore[no-untyped-call]
    return text


def number(x: float) -> str:
    """``go_float(x)``, which is ``repr(float(x))`` for every finite x below 1e6 (fast path)."""
    if -1e6 < x < 1e6:
        return f"{x}.0" if isinstance(x, int) else repr(float(x))
    return go_float(x)


def head(name: str, help_: str, kind: str) -> str:
    doc = help_.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class TextFamily:
    """One family written line by line at scrape time (``kind``: gauge or counter; a counter's ``name``
    is given with its ``_total``)."""

    __slots__ = ("_lines", "_names", "name")

    def __init__(self, name: str, help_: str, kind: str, labels: Sequence[str] = ()) -> None:
        self.name, self._names = name, tuple(labels)
        self._lines = [head(name, help_, kind)]

    def add(self, values: tuple[str, ...], value: float) -> None:
        labels = labels_text(self._names, values) if self._names else ""
        self._lines.append(
            f"{self.name}{{{labels}}} {number(value)}\n" if labels else f"{self.name} {number(value)}\n"
        )

    def text(self) -> str:
        return "".join(self._lines)


class TextCollector(Collector):
    """A collector that writes text; ``collect()`` is the same families, parsed back."""

    @abstractmethod
    def text(self) -> Iterator[str]:
        """The collector's families in the text format, line by line."""

    def collect(self) -> Iterator[Metric]:
        yield from text_string_to_metric_families("".join(self.text()))


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class _Labelled:
    """Children per label values; ``retain`` drops those whose ``label`` is not in ``keep``."""

    _names: tuple[str, ...]
    _children: dict[tuple[str, ...], Any]

    def retain(self, label: str, keep: Container[str]) -> None:
        if label not in self._names:
            return
        i = self._names.index(label)
        for values in [v for v in self._children if v[i] not in keep]:
            del self._children[values]


class FastCounter(_Labelled, TextCollector):
    """``labels(*values).inc(n)``, as prometheus-client's ``Counter``; written as ``<name>_total``."""

    def __init__(self, name: str, help_: str, labels: Sequence[str]) -> None:
        self.name, self._names = name + "_total", tuple(labels)
        self._head = head(self.name, help_, "counter")
        self._children: dict[tuple[str, ...], _CounterChild] = {}

    def labels(self, *values: str) -> _CounterChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._names):
                raise ValueError(f"{self.name} takes labels {self._names}, got {values}")
            child = self._children[values] = _CounterChild()
        return child

    def value(self, *values: str) -> float:
        child = self._children.get(values)
        return child.value if child is not None else 0.0

    def text(self) -> Iterator[str]:
        yield self._head
        for values, child in self._children.items():
            labels = labels_text(self._names, values)
            yield (
                f"{self.name}{{{labels}}} {number(child.value)}\n"
                if labels
                else f"{self.name} {number(child.value)}\n"
            )


class _Child:
    __slots__ = ("counts", "labels", "sum")

    def __init__(self, labels: str, buckets: int) -> None:
        self.labels, self.counts, self.sum = labels, [0] * buckets, 0.0

    def observe(self, value: float, bounds: Sequence[float]) -> None:
        self.counts[bisect_left(bounds, value)] += 1
        self.sum += value


class FastHistogram(_Labelled, TextCollector):
    """``labels(*values).observe(v)`` / ``observe(v, *values)``; buckets are upper bounds (le), +Inf added."""

    def __init__(self, name: str, help_: str, labels: Sequence[str], buckets: Iterable[float]) -> None:
        self.name, self._names = name, tuple(labels)
        self._bounds = (*sorted(float(b) for b in buckets if b != inf), inf)
        self._le = tuple(go_float(b) for b in self._bounds)
        self._head = head(name, help_, "histogram")
        self._children: dict[tuple[str, ...], _Child] = {}

    def observe(self, value: float, *values: str) -> None:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _Child(labels_text(self._names, values), len(self._bounds))
        child.observe(value, self._bounds)

    def text(self) -> Iterator[str]:
        yield self._head
        name = self.name
        for c in self._children.values():
            sep = "," if c.labels else ""
            acc = 0
            for le, n in zip(self._le, c.counts, strict=True):
                acc += n
                yield f'{name}_bucket{{{c.labels}{sep}le="{le}"}} {number(acc)}\n'
            labels = f"{{{c.labels}}}" if c.labels else ""
            yield f"{name}_count{labels} {number(acc)}\n{name}_sum{labels} {go_float(c.sum)}\n"


def _generic(m: Metric) -> Iterator[str]:
    name = m.name + "_total" if m.type == "counter" else m.name
    yield head(name, m.documentation, _KINDS.get(m.type, "untyped"))
    skip = tuple(m.name + s for s in _SKIP)
    for s in m.samples:
        if s.name in skip:
            continue
        if s.labels:
            labels = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(s.labels.items()))
            yield f"{s.name}{{{labels}}} {number(s.value)}\n"
        else:
            yield f"{s.name} {number(s.value)}\n"


def render(collectors: Iterable[Collector]) -> bytes:
    out: list[str] = []
    for c in collectors:
        if isinstance(c, TextCollector):
            out.extend(c.text())
        else:
            for m in c.collect():
                out.extend(_generic(m))
    return "".join(out).encode()
