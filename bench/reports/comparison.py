"""Comparing gateway runs of one workload request by request, and issue 13's targets as verdicts.

- `agreement(reference, other)`: of the requests that succeeded in both runs (matched by the workload's
  request index), the share whose serving replica (`Record.replica`, the emulator's `x-emu-replica`) is
  the same. The runs use the same replica addresses (bench.gateways reuses the fleet's ports), so a
  replica's id means the same replica in both.
- `mean_ttft`, `hit_ratio` (sum cached_tokens / sum prompt_tokens) over the requests that succeeded;
  `stickiness`: the share of a session's later turns served where its previous turn was (agent: with
  several gateways, whether a session stays on its replica whichever gateway a turn goes through).
- `one_view(previews)`: of the requests every gateway previewed (bench.systems.gateway_pool's route previews:
  each gateway asked, at the same moment just before the request was sent, where it would route it), the
  share on which all of them named the same replica: whether several gateways decide as one gateway
  would, free of the run-to-run noise that `agreement` between two separate runs carries;
  `preview_held(previews, sends, records)`: the share of those requests served where the gateway that
  took it had said (what changed in the moment between the preview and the real decision).
- `restart_span(sends, gateway, n)`: the restarted gateway's first n requests after it came back (its
  `generation` 1), and the other gateways' requests sent over the same span (between the first and the
  last of those n, in the order the client sent them).
- `throughput_ratios`: bench.overhead's req/s of kvroute with Redis sync over kvroute without, per
  scenario.
- `within(ratio, tol)`: |ratio - 1| <= tol; `verdict(ok)`: "PASS" or "MISS".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bench.overhead.requests import Result as OverheadResult
from bench.runs.replay import Record
from bench.systems.gateway_pool import Send

AGREEMENT_TARGET = 0.98  # >= 98% of requests reach the replica a single gateway would choose
TTFT_TOLERANCE = 0.05  # mean TTFT within 5% of a single gateway's
HIT_TOLERANCE = 0.05  # a restarted gateway's hit ratio within 5% of the others'
THROUGHPUT_TARGET = 0.9  # req/s with Redis sync >= 0.9x without
FIRST_AFTER_RESTART = 50
NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Agreement:
    matched: int  # requests that succeeded in both runs
    same: int  # of those, served by the same replica

    @property
    def share(self) -> float:
        return self.same / self.matched if self.matched else NAN


def agreement(reference: Sequence[Record], other: Sequence[Record]) -> Agreement:
    served = {r.index: r.replica for r in reference if r.ok}
    pairs = [(served[r.index], r.replica) for r in other if r.ok and r.index in served]
    return Agreement(len(pairs), sum(1 for a, b in pairs if a == b))


def first_difference(reference: Sequence[Record], other: Sequence[Record]) -> int | None:
    """The lowest request index both runs served, on different replicas (None: they agree)."""
    served = {r.index: r.replica for r in reference if r.ok}
    differ = [r.index for r in other if r.ok and r.index in served and served[r.index] != r.replica]
    return min(differ, default=None)


def mean_ttft(records: Iterable[Record]) -> float:
    ttfts = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    return sum(ttfts) / len(ttfts) if ttfts else NAN


def hit_ratio(records: Iterable[Record]) -> float:
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return sum(r.cached_tokens for r in ok) / prompt if prompt else NAN


def stickiness(records: Sequence[Record]) -> float:
    """Of the requests that follow an earlier one of their session (in index order, both succeeded), the
    share served by the replica that served the previous one (NaN without such requests)."""
    last: dict[str, str] = {}
    same = total = 0
    for r in sorted((r for r in records if r.ok), key=lambda r: r.index):
        if r.session in last:
            total += 1
            same += last[r.session] == r.replica
        last[r.session] = r.replica
    return same / total if total else NAN


def one_view(previews: Mapping[int, Sequence[str]]) -> Agreement:
    asked = [p for p in previews.values() if len(p) > 1 and all(p)]
    return Agreement(len(asked), sum(1 for p in asked if len(set(p)) == 1))


def preview_held(
    previews: Mapping[int, Sequence[str]], sends: Sequence[Send], records: Sequence[Record]
) -> Agreement:
    """Requests served by the replica that their deciding gateway's preview named (previews are in the
    order of the gateways that were up, so this assumes none was out of the rotation)."""
    served = {r.index: r.replica for r in records if r.ok}
    said = [
        (previews[s.request][s.gateway], served[s.request])
        for s in sends
        if s.request in previews and s.request in served and s.gateway < len(previews[s.request])
    ]
    return Agreement(len(said), sum(1 for a, b in said if a == b))


def ratio(a: float, b: float) -> float:
    return a / b if b else NAN


def restart_span(sends: Sequence[Send], gateway: int, n: int) -> tuple[list[int], list[int]]:
    """(the request indices of `gateway`'s first n sends after its restart, the other gateways' request
    indices sent between the first and the last of those); ([], []) if it got none after its restart."""
    positions = [k for k, s in enumerate(sends) if s.gateway == gateway and s.generation > 0][:n]
    if not positions:
        return [], []
    span = sends[positions[0] : positions[-1] + 1]
    mine = [s.request for s in span if s.gateway == gateway]
    return mine, [s.request for s in span if s.gateway != gateway]


def pick(records: Sequence[Record], indices: Iterable[int]) -> list[Record]:
    by_index = {r.index: r for r in records}
    return [by_index[i] for i in indices if i in by_index]


class Throughput(NamedTuple):
    scenario: str
    concurrency: int
    without_rps: float
    with_rps: float

    @property
    def ratio(self) -> float:
        return ratio(self.with_rps, self.without_rps)


def throughput_ratios(
    results: Sequence[OverheadResult], synced: str = "kvroute+state", alone: str = "kvroute"
) -> list[Throughput]:
    by = {(r.scenario, r.concurrency, r.target): r.rps for r in results}
    keys = dict.fromkeys((r.scenario, r.concurrency) for r in results)
    return [Throughput(s, c, by.get((s, c, alone), NAN), by.get((s, c, synced), NAN)) for s, c in keys]


def within(value: float, tol: float) -> bool:
    return not math.isnan(value) and abs(value - 1.0) <= tol + 1e-12


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"
