"""Hybrid resume points: the cache model cuts a match that stops inside a recorded prompt to the resume grid.

Units: 16 estimated engine tokens per block unless a test says otherwise; the hybrid replica resumes
every 64 engine tokens (4 blocks) and at the end of served prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from routing.cache_model import CacheModel
from routing.config import RoutingConfig
from routing.ledger import Recorded
from routing.resume import SequenceEnds, grid_tokens
from routing.types import NO_MATCH, PrefixMatch, ReplicaState, Report, RoutingRequest

BT = 16.0
CFG = RoutingConfig(block_chars=64, chars_per_token=4.0)
DOC = tuple(range(100, 110))  # a 10-block document (160 tokens)
HYBRID = ReplicaState(
    id="a", gpu_tokens=4000, host_tokens=8000, write_policy="write_back", hybrid=True, resume_interval=64
)


def req(blocks: tuple[int, ...], extra_tokens: float = 5.0, bt: float = BT) -> RoutingRequest:
    """A prompt of ``blocks`` full blocks plus ``extra_tokens`` of unhashed tail."""
    return RoutingRequest(
        model="m", block_hashes=blocks, prompt_tokens=int(len(blocks) * bt + extra_tokens), block_tokens=bt
    )


def new_model() -> CacheModel:
    return CacheModel(CFG, BT)


def match(model: CacheModel, r: RoutingRequest, states: Sequence[ReplicaState]) -> dict[str, PrefixMatch]:
    model.sync(states)
    found = model.match(r, states)
    return {s.id: found.get(s.id, NO_MATCH) for s in states}


def other(n: int) -> tuple[int, ...]:
    return tuple(range(900, 900 + n))


def serve(model: CacheModel, r: RoutingRequest) -> Recorded:
    rec = model.record(r, "a")
    assert rec is not None
    return rec


def predicted(served: list[RoutingRequest], ask: RoutingRequest, state: ReplicaState = HYBRID) -> float:
    model = new_model()
    model.sync([state])
    for r in served:
        serve(model, r)
    return match(model, ask, [state])["a"].total_tokens


EXTRA_BUFFER = replace(HYBRID, resume_at_end=False)  # only tracked states: every 64 tokens, not at ends
UNCHUNKED = replace(HYBRID, resume_interval=1 << 40)  # chunked prefill off: resume only at prompt ends
NOT_HYBRID = replace(HYBRID, hybrid=False, resume_interval=0)


@pytest.mark.parametrize(
    ("served", "ask", "state", "expected"),
    [
        # another question after the same document (same length): a branch inside the tail, cut to 128
        ([req(DOC)], req(DOC), HYBRID, 128.0),
        # a conversation that grew by a short turn (no new full block): the previous prompt's end
        ([req(DOC)], req(DOC, extra_tokens=15.0), HYBRID, 160.0),
        # ... and by a long one (new blocks after it)
        ([req(DOC)], req(DOC + other(3)), HYBRID, 160.0),
        # the request diverges inside a full block: 9 blocks = 144 tokens → 128
        ([req(DOC)], req(DOC[:9] + other(2)), HYBRID, 128.0),
        # it diverges exactly on a resume point: nothing to cut
        ([req(DOC)], req(DOC[:8] + other(2)), HYBRID, 128.0),
        # shorter than one interval: no resume point at all
        ([req(DOC)], req(DOC[:3] + other(4)), HYBRID, 0.0),
        # a strict prefix of the recorded prompt ends inside it: 7 blocks = 112 → 64
        ([req(DOC)], req(DOC[:7]), HYBRID, 64.0),
        # it ends where an earlier, shorter prompt ended (and contains it): that prompt's end resumes
        ([req(DOC[:6]), req(DOC)], req(DOC[:6] + other(3)), HYBRID, 96.0),
        # a shorter request cannot contain the recorded prompt that ends at its last matched block
        ([req(DOC, extra_tokens=12.0)], req(DOC, extra_tokens=2.0), HYBRID, 128.0),
        # extra_buffer: prompt ends are not resume points, even for a grown conversation
        ([req(DOC)], req(DOC + other(3)), EXTRA_BUFFER, 128.0),
        # chunked prefill off: a branch resumes nowhere, a grown conversation at the previous end
        ([req(DOC)], req(DOC), UNCHUNKED, 0.0),
        ([req(DOC)], req(DOC + other(3)), UNCHUNKED, 160.0),
        # not hybrid: any point resumes
        ([req(DOC)], req(DOC[:9] + other(2)), NOT_HYBRID, 144.0),
        ([req(DOC)], req(DOC), NOT_HYBRID, 160.0),
    ],
)
def test_a_hybrid_match_is_cut_to_the_last_resume_point(
    served: list[RoutingRequest], ask: RoutingRequest, state: ReplicaState, expected: float
) -> None:
    assert predicted(served, ask, state) == expected


def test_the_cut_applies_across_tiers_gpu_first() -> None:
    model = new_model()
    small = replace(HYBRID, gpu_tokens=int(6 * BT))  # the 10-block document cannot stay on GPU
    model.sync([small])
    serve(model, req(DOC))
    serve(model, req(other(6)))  # pushes the document's blocks to host (write_back)
    m = match(model, req(DOC), [small])["a"]
    assert (m.gpu_tokens, m.host_tokens) == (0.0, 128.0)


def test_the_grid_is_in_engine_tokens_at_the_current_estimate() -> None:
    """Blocks of 32 engine tokens (the estimate after learning the engine counts 2x): 10 blocks = 320
    tokens → 288 on a 96-grid, 300 on a 100-grid; at 16 tokens a block they would be 96 and 100."""
    state = replace(HYBRID, resume_interval=96)
    model = new_model()
    model.sync([state])
    model.resize(2 * BT)
    serve(model, req(DOC, bt=2 * BT))
    assert match(model, req(DOC, bt=2 * BT), [state])["a"].total_tokens == 288.0
    assert match(model, req(DOC, bt=2 * BT), [replace(state, resume_interval=100)])["a"].total_tokens == 300.0


def observe(model: CacheModel, r: RoutingRequest, cached: int) -> None:
    model.settle(serve(model, r), Report(ok=True, prompt_tokens=r.prompt_tokens, cached_tokens=cached))


@pytest.mark.parametrize(
    ("cached", "shrinks"),
    [
        (128, False),  # the replica resumed at the predicted resume point
        (70, False),  # below it by less than one interval: a chunk boundary off the grid
        (40, True),  # far below: the model kept blocks the replica had evicted
    ],
)
def test_a_shortfall_explained_by_the_cut_does_not_shrink_the_capacity(cached: int, shrinks: bool) -> None:
    model = new_model()
    model.sync([HYBRID])
    observe(model, req(DOC), 0)
    observe(model, req(DOC[:9] + other(2)), cached)  # predicted: 128
    stats = model.accuracy()["a"]
    assert (stats.gpu_factor < 1.0) == shrinks
    assert stats.mean_predicted_tokens == pytest.approx(64.0)  # (0 + 128) / 2


def test_a_grown_conversation_that_finds_nothing_still_shrinks_the_capacity() -> None:
    model = new_model()
    model.sync([HYBRID])
    observe(model, req(DOC), 0)
    observe(model, req(DOC + other(3)), 0)  # predicted 160: a real miss
    assert model.accuracy()["a"].gpu_factor < 1.0


def test_a_request_that_never_ran_leaves_no_resume_point() -> None:
    model = new_model()
    model.sync([HYBRID])
    serve(model, req(DOC + other(3)))  # the document's blocks are cached, its end is not a prompt end
    model.settle(serve(model, req(DOC)), Report(ok=False))  # failed before its first byte: never ran
    assert match(model, req(DOC, extra_tokens=15.0), [HYBRID])["a"].total_tokens == 128.0
    serve(model, req(DOC))  # now it ran
    assert match(model, req(DOC, extra_tokens=15.0), [HYBRID])["a"].total_tokens == 160.0


def test_a_restart_forgets_resume_points() -> None:
    model = new_model()
    model.sync([replace(HYBRID, started_at=1.0)])
    serve(model, req(DOC))
    restarted = replace(HYBRID, started_at=2.0)
    model.sync([restarted])
    serve(model, req(DOC + other(3)))  # the blocks are back, the old prompt end is not
    assert match(model, req(DOC, extra_tokens=15.0), [restarted])["a"].total_tokens == 128.0


def test_sequence_ends_are_bounded_and_skip_prompts_cut_at_max_blocks() -> None:
    ends = SequenceEnds(capacity=64)
    for n in range(200):
        ends.add((n,), BT + 1, BT)
    assert len(ends) <= 64
    assert ends.contained(199, 3 * BT, BT) and not ends.contained(0, 3 * BT, BT)
    assert not ends.add((1000, 1001), 40 * BT, BT)  # 40 blocks of prompt, 2 hashed: no known end
    assert not ends.contained(1001, 50 * BT, BT)
    assert ends.add((7, 8), 2 * BT + 3, BT) and not ends.add((7, 8), 2 * BT + 9, BT)  # known: keeps min
    assert ends.contained(8, 2 * BT + 5, BT)


@pytest.mark.parametrize(
    ("tokens", "interval", "expected"),
    [(3000.0, 2048, 2048.0), (2047.9, 2048, 0.0), (4096.0, 2048, 4096.0), (300.0, 256, 256.0), (5.0, 0, 5.0)],
)
def test_grid_tokens(tokens: float, interval: int, expected: float) -> None:
    assert grid_tokens(tokens, interval) == expected
