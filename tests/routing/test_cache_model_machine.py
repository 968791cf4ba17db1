"""State-machine test: CacheModel against the naive list-based reference (tests/routing/reference.py).

Random fleets (capacities, write policies, hybrid flags with resume intervals, a global budget), random
requests drawn from a few shared documents plus random tails, restarts and forgets; after every step the
model's tiers must equal the reference's block for block, in LRU order, and every match must agree,
including the cut of hybrid matches to their resume points (routing.resume: the end of a recorded prompt
that the request is longer than, else the last multiple of the resume interval).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.ledger import Recorded
from routing.prefix_reuse import LOAD_BACK_MIN_TOKENS, PREFETCH_MIN_TOKENS
from routing.types import NO_MATCH, PrefixMatch, ReplicaState, Report, RoutingRequest, WritePolicy
from tests.routing.reference import RefEnds, RefProvisional, RefTiers

REPLICAS = ("r0", "r1", "r2", "r3")
POLICIES: tuple[WritePolicy | None, ...] = (None, "write_back", "write_through", "write_through_selective")
DOCS = tuple(tuple(range(1000 * d, 1000 * d + 40)) for d in range(1, 5))


def _chain(prefix: tuple[int, ...], tail: list[int]) -> tuple[int, ...]:
    out, h = list(prefix), (prefix[-1] if prefix else 7)
    for x in tail:
        h = hash((h, x)) & 0xFFFFFFFFFFFF
        out.append(h)
    return tuple(out)


requests = st.builds(
    _chain,
    st.sampled_from(DOCS).flatmap(lambda d: st.integers(0, len(d)).map(lambda k: d[:k])),
    st.lists(st.integers(0, 2), max_size=25),
).filter(bool)


def _request(hashes: tuple[int, ...]) -> RoutingRequest:
    return RoutingRequest(model="m", block_hashes=hashes, prompt_tokens=len(hashes) + 1, block_tokens=1.0)


def _ref_tokens(g: int, h: int, s: int, cap: float = float("inf")) -> PrefixMatch:
    gpu, host, storage = float(g), float(h), float(s)
    if cap < gpu + host + storage:
        gpu = min(gpu, cap)
        host = min(host, cap - gpu)
        storage = min(storage, cap - gpu - host)
    if 0 < host < LOAD_BACK_MIN_TOKENS:
        host, storage = 0.0, 0.0
    if storage < PREFETCH_MIN_TOKENS:
        storage = 0.0
    return PrefixMatch(gpu, host, storage)


def _ref_resume(state: ReplicaState, ends: RefEnds, hashes: tuple[int, ...], n: int) -> float:
    """Block tokens are 1 and the engine ratio stays 1: a match of n blocks is n engine tokens."""
    if state.resume_interval <= 0 or n == 0:
        return float("inf")
    length = ends.length(hashes[n - 1]) if state.resume_at_end else None
    if length is not None and (len(hashes) + 1) - length > 1.5:  # contains the recorded prompt
        return float("inf")
    return float(n // state.resume_interval * state.resume_interval)


class CacheModelMachine(RuleBasedStateMachine):
    @initialize(budget=st.sampled_from([10_000, 150]))
    def start(self, budget: int) -> None:
        self.budget = budget
        cfg = RoutingConfig(block_chars=4, chars_per_token=4.0, model_budget_blocks=budget)
        self.model = CacheModel(cfg, block_tokens=1.0)
        self.open: list[tuple[Recorded, int, bool]] = []  # receipt, held_from, new_end (reference side)
        self.held = RefProvisional()
        self.ref: dict[str, RefTiers] = {}
        self.ends: dict[str, RefEnds] = {}
        self.states: dict[str, ReplicaState] = {}
        self.sync("r0", 12, 15, 300, "write_back", False, False)  # a storage tier behind a small host
        self.sync("r1", 12, 30, 0, "write_through", False, False)
        self.sync("r2", 12, 30, 300, "write_through_selective", False, False)
        self.sync("r3", 12, 30, 0, "write_back", True, False, 4, True)  # hybrid: resumes every 4 blocks

    def _ref_resize(self) -> None:
        raw = {rid: self._raw(s) for rid, s in self.states.items()}
        total = sum(sum(v) for v in raw.values())
        scale = min(1.0, self.budget / total) if total else 1.0
        for rid, (g, h, s) in raw.items():
            self.ref[rid].configure(
                int(g * scale), int(h * scale), int(s * scale), self.states[rid].write_policy
            )
            tiers = self.ref[rid]
            self.ends[rid].capacity = tiers.gpu.capacity + tiers.host.capacity + tiers.storage.capacity

    @staticmethod
    def _raw(state: ReplicaState) -> tuple[float, float, float]:
        reusable = (
            state.write_policy is not None
            and state.host_tokens > 0
            and not (state.hybrid and state.write_policy != "write_back")
        )
        return (
            float(state.gpu_tokens),
            float(state.host_tokens if reusable else 0),
            float(state.storage_tokens if reusable else 0),
        )

    @rule(
        rid=st.sampled_from(REPLICAS),
        gpu=st.integers(0, 40),
        host=st.integers(0, 80),
        storage=st.sampled_from([0, 0, 300]),
        policy=st.sampled_from(POLICIES),
        hybrid=st.booleans(),
        restart=st.booleans(),
        interval=st.sampled_from([0, 4, 7]),
        at_end=st.booleans(),
    )
    def sync(
        self,
        rid: str,
        gpu: int,
        host: int,
        storage: int,
        policy: WritePolicy | None,
        hybrid: bool,
        restart: bool,
        interval: int = 0,
        at_end: bool = True,
    ) -> None:
        old = self.states.get(rid)
        started = (old.started_at + (1 if restart else 0)) if old else 1.0
        state = ReplicaState(
            id=rid,
            gpu_tokens=gpu,
            host_tokens=host,
            storage_tokens=storage,
            write_policy=policy,
            hybrid=hybrid,
            started_at=started,
            resume_interval=interval if hybrid else 0,
            resume_at_end=at_end,
        )
        self.model.sync([state])
        if rid not in self.ref:
            self.ref[rid] = RefTiers()
            self.ends[rid] = RefEnds()
        elif old is not None and old.started_at != started:
            self.ref[rid].restart()
            self.ends[rid] = RefEnds()
            self.held.counts.pop(rid, None)
        self.states[rid] = state
        self._ref_resize()

    @rule(rid=st.sampled_from(REPLICAS), hashes=requests)
    def record(self, rid: str, hashes: tuple[int, ...]) -> None:
        if rid not in self.states:
            return
        runs = self.ref[rid].runs(hashes)
        rec = self.model.record(_request(hashes), rid)
        assert rec is not None and self.ref[rid].insert(hashes) == runs
        state, new_end = self.states[rid], False
        if state.resume_interval > 0 and state.resume_at_end:
            new_end = self.ends[rid].add(hashes, len(hashes) + 1, 1.0)
        held_from = self.held.first_held(rid, hashes[: sum(runs)])
        self.held.hold(rid, hashes[held_from:])
        assert rec.held_from == held_from and rec.new_end == new_end
        self.open.append((rec, held_from, new_end))
        self.last = (rid, hashes)

    @rule(pick=st.integers(0, 1000), ran=st.booleans())
    def settle(self, pick: int, ran: bool) -> None:
        """An in-flight request finishes: it ran (its blocks are real) or never ran (rolled back)."""
        if not self.open:
            return
        rec, held_from, new_end = self.open.pop(pick % len(self.open))
        rid, blocks = rec.replica, rec.request.block_hashes[held_from:]
        self.model.settle(rec, Report(ok=True, ttft_s=0.1) if ran else Report(ok=False))
        if ran:
            self.held.confirm(rid, blocks)
            return
        gone = self.held.release(rid, blocks)
        if rid in self.ref:
            self.ref[rid].discard(gone)
            if new_end:
                self.ends[rid].discard(rec.request.block_hashes[-1])

    @rule(cut=st.integers(0, 6), extra=st.integers(0, 3), again=st.booleans())
    def follow_up(self, cut: int, extra: int, again: bool) -> None:
        """The last recorded request again, shortened by ``cut`` blocks and grown by ``extra`` (a re-send,
        a branch, a grown conversation), matched and maybe recorded on the same replica."""
        last = getattr(self, "last", None)
        if last is None or len(last[1]) <= cut:
            return
        rid, hashes = last
        follow = _chain(hashes[: len(hashes) - cut], list(range(extra)))
        self.match(follow)
        if again:
            self.record(rid, follow)

    @rule(hashes=requests)
    def match(self, hashes: tuple[int, ...]) -> None:
        states = list(self.states.values())
        self.model.sync(states)
        found = self.model.match(_request(hashes), states)
        got = {s.id: found.get(s.id, NO_MATCH) for s in states}
        want = {}
        for rid, state in self.states.items():
            g, h, s = self.ref[rid].runs(hashes)
            want[rid] = _ref_tokens(g, h, s, _ref_resume(state, self.ends[rid], hashes, g + h + s))
        assert got == want

    @rule(rid=st.sampled_from(REPLICAS))
    def forget(self, rid: str) -> None:
        self.model.forget(rid)
        self.held.counts.pop(rid, None)
        self.ref.pop(rid, None)
        self.ends.pop(rid, None)
        self.states.pop(rid, None)
        self._ref_resize()

    @invariant()
    def tiers_equal_the_reference(self) -> None:
        if not hasattr(self, "model"):
            return
        for rid, ref in self.ref.items():
            tiers = self.model.tiers(rid)
            assert tiers is not None
            assert tiers.gpu.order() == ref.gpu.items
            assert tiers.host.order() == ref.host.items
            assert tiers.storage.order() == ref.storage.items
            for lru in (tiers.gpu, tiers.storage):
                assert len(lru) <= lru.capacity
            assert len(tiers.host) - tiers.host.capacity <= len(tiers.gpu)  # only GPU copies beyond it
            if self.states[rid].write_policy is None:
                assert len(tiers.host) == 0 and len(tiers.storage) == 0
        assert self.model.blocks() <= self.budget
        assert {rid for rid in REPLICAS if self.model.tiers(rid) is not None} == set(self.ref)


CacheModelMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCacheModel = CacheModelMachine.TestCase
