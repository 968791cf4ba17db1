"""proxy/sync/kv_wire.py merges runs of page events (``Runs``): SGLang publishes one BlockStored per page, and
the gateway applies a chain of pages as one event. Merged or not, the cache model must end up the same."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sync.kv_wire import BlockRemoved, BlockStored, WireError, decode_batch
from routing.config import RoutingConfig
from routing.router import Router
from routing.types import ReplicaState

PAGE = 4


def page(h: int, parent: int | None, tokens: list[int], medium: str = "GPU", **extra: Any) -> dict[str, Any]:
    """One page's BlockStored in the 0.5.23 map encoding."""
    ev = {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent, "token_ids": tokens}
    return ev | {"block_size": PAGE, "lora_id": None, "medium": medium} | extra


def gone(*hashes: int, medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def decoded(events: list[Any], merge: bool = True) -> tuple[Any, ...]:
    return decode_batch(msgpack.packb([1.0, events, 0]), merge=merge).events


def test_a_chain_of_pages_is_one_event() -> None:
    events = [page(10, None, [1, 2, 3, 4]), page(11, 10, [5, 6, 7, 8]), page(12, 11, [9, 9])]
    (one,) = decoded(events)
    assert one == BlockStored((10, 11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8, 9, 9), PAGE, None, "GPU")
    assert len(decoded(events, merge=False)) == 3  # the engine's own events, page by page


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (page(11, 99, [5, 6, 7, 8]), "its parent is not the run's last page"),
        (page(11, 10, [5, 6, 7, 8], medium="CPU_PINNED"), "another medium"),
        (page(11, 10, [5, 6, 7, 8], cache_salt="t"), "another namespace"),
        ({**page(11, 10, [5, 6, 7, 8]), "lora_id": 3}, "another adapter"),
        (gone(10), "another kind"),
    ],
)
def test_a_run_ends_where_the_next_event_does_not_continue_it(second: dict[str, Any], why: str) -> None:
    assert len(decoded([page(10, None, [1, 2, 3, 4]), second])) == 2, why


def test_a_partial_page_ends_the_run() -> None:
    events = [page(10, None, [1, 2]), page(11, 10, [3, 4, 5, 6])]
    assert [e.block_hashes for e in decoded(events)] == [(10,), (11,)]


def test_removals_merge_per_medium_and_a_flush_splits() -> None:
    events = [gone(1, 2), gone(3), gone(4, medium="CPU_PINNED"), {"type": "AllBlocksCleared"}, gone(5)]
    got = decoded(events)
    assert got[:3] == (BlockRemoved((1, 2, 3), "GPU"), BlockRemoved((4,), "CPU_PINNED"), got[2])
    assert [type(e).__name__ for e in got] == [
        "BlockRemoved",
        "BlockRemoved",
        "AllBlocksCleared",
        "BlockRemoved",
    ]


@pytest.mark.parametrize(
    "bad",
    [
        page(11, 10, [5, True, 7, 8]),
        {**page(11, 10, [5, 6, 7, 8]), "block_hashes": ["x"]},
        {**page(11, 10, [5, 6, 7, 8]), "token_ids": "abcd"},
    ],
)
def test_a_malformed_page_inside_a_run_fails_the_batch(bad: dict[str, Any]) -> None:
    with pytest.raises(WireError):
        decoded([page(10, None, [1, 2, 3, 4]), bad, page(12, 11, [9, 9, 9, 9])])


def model_after(batches: list[list[Any]], merge: bool) -> tuple[Any, ...]:
    router = Router(RoutingConfig(token_block=PAGE))
    router.sync(
        [ReplicaState("r", gpu_tokens=4096, host_tokens=8192, page_size=PAGE, write_policy="write_back")]
    )
    for seq, events in enumerate(batches):
        batch = decode_batch(msgpack.packb([float(seq), events, 0]), seq, merge=merge)
        router.apply_kv_events("r", batch, "m")
    mode, tiers = router.kv_mode("r"), router.cache.tiers("r")
    assert tiers is not None
    return mode.pages, mode.orphans, set(tiers.gpu.order()), set(tiers.host.order())


@st.composite
def streams(draw: st.DrawFn) -> list[list[Any]]:
    """Batches of page events over a few chains: stores extend a chain (sometimes from a stale parent),
    removals drop a chain's tail on one medium."""
    tips: dict[int, int | None] = {c: None for c in range(3)}
    next_hash, batches = 100, []
    for _ in range(draw(st.integers(1, 5))):
        events: list[Any] = []
        for _ in range(draw(st.integers(0, 12))):
            chain = draw(st.integers(0, 2))
            if draw(st.integers(0, 3)) == 0 and tips[chain] is not None:
                events.append(gone(tips[chain] or 0, medium=draw(st.sampled_from(["GPU", "CPU_PINNED"]))))
                continue
            parent = tips[chain] if draw(st.booleans()) or tips[chain] is None else tips[chain] - 1
            medium = draw(st.sampled_from(["GPU", "GPU", "CPU_PINNED"]))
            events.append(page(next_hash, parent, [chain, next_hash % 7, 1, 2], medium))
            tips[chain], next_hash = next_hash, next_hash + 1
        batches.append(events)
    return batches


@settings(max_examples=60, deadline=None)
@given(streams())
def test_merged_and_page_by_page_events_leave_the_same_model(batches: list[list[Any]]) -> None:
    assert model_after(batches, merge=True) == model_after(batches, merge=False)
