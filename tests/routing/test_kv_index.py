"""Table tests of routing.kv_index: engine pages -> our exact-mode keys."""

from __future__ import annotations

import pytest

from routing.canonical import namespace_salt
from routing.hashing import token_block_hashes
from routing.kv_events import BlockStored
from routing.kv_index import MIN_CAPACITY_PAGES, KvIndex
from routing.prompt import Namespace
from tests.routing.kv_pages import ids, stored

B = 64


def index(capacity: int = 10_000, max_blocks: int = 100) -> KvIndex:
    return KvIndex("m", B, max_blocks, capacity)


def apply(idx: KvIndex, events: list[BlockStored]) -> list[int]:
    return [k for ev in events for k in idx.stored(ev)]


@pytest.mark.parametrize(
    ("pages", "groups"),
    [
        (10, ()),  # one event with every page
        (10, (1,) * 10),  # one event per page
        (10, (3, 1, 5, 1)),  # uneven groups, blocks completing mid-event
        (8, (4, 4)),  # events aligned with blocks
        (3, ()),  # no full block
    ],
)
def test_a_chain_split_across_events_maps_to_the_keys_of_the_whole(
    pages: int, groups: tuple[int, ...]
) -> None:
    tokens = ids(pages * 16, 7)
    assert apply(index(), stored(tokens, 100, groups)) == list(token_block_hashes("m", tokens, "", B, 100))


@pytest.mark.parametrize("page", [1, 2, 8, 16, 32, 64])
def test_every_page_size_dividing_the_block_maps_exactly(page: int) -> None:
    tokens = ids(256, 3)
    idx = index()
    keys = apply(idx, stored(tokens, 0, page=page))
    assert keys == list(token_block_hashes("m", tokens, "", B, 100))
    assert idx.why == ""


def test_a_child_maps_from_its_known_parent_without_the_prefix() -> None:
    idx = index()
    first, second = ids(128), ids(96, 500)
    apply(idx, stored(first, 0))
    keys = apply(idx, stored(second, 50, parent=7))  # page 7 ends the first chain
    whole = token_block_hashes("m", first + second, "", B, 100)
    assert keys == list(whole[2:])  # 224 tokens: blocks 3 (from the parent's state) ... 3


def test_a_salted_root_starts_the_namespace_of_cache_salt() -> None:
    tokens = ids(128)
    keys = apply(index(), stored(tokens, 0, salt="s1"))
    salt = namespace_salt(Namespace(cache_salt="s1"))
    assert keys == list(token_block_hashes("m", tokens, salt, B, 100))
    assert keys != list(token_block_hashes("m", tokens, "", B, 100))


def test_removal_maps_back_and_a_page_lives_while_any_medium_holds_it() -> None:
    idx = index()
    tokens = ids(128)
    keys = apply(idx, stored(tokens, 0))
    apply(idx, stored(tokens, 0, medium="CPU_PINNED"))
    assert idx.removed((3, 7), "GPU") == keys  # pages 3 and 7 complete blocks 0 and 1
    assert keys[1] in idx and len(idx) == 8  # still on host
    assert idx.removed((7,), "CPU_PINNED") == [keys[1]]
    assert keys[1] not in idx and keys[0] in idx and len(idx) == 7
    assert idx.removed((2,), None) == []  # a page inside a block names no key
    assert idx.removed((999,), None) == []  # unknown pages are ignored


def test_a_page_size_that_does_not_divide_the_block_cannot_be_exact() -> None:
    idx = index()
    assert apply(idx, stored(ids(96), 0, page=48)) == []
    assert idx.why == "engine page size 48 does not divide token_block 64"
    assert idx.stats.skipped == 2


def test_orphans_and_lora_pages_are_skipped() -> None:
    idx = index()
    assert apply(idx, stored(ids(64), 0, parent=12345)) == []
    assert idx.stats.orphans == 4
    lora = BlockStored((1,), None, ids(16), 16, lora_id=3)
    assert idx.stored(lora) == [] and idx.why == ""


def test_keys_stop_at_max_blocks_but_the_chain_goes_on() -> None:
    tokens = ids(256)
    idx = index(max_blocks=2)
    assert apply(idx, stored(tokens, 0)) == list(token_block_hashes("m", tokens, "", B, 2))
    assert len(idx) == 16


def test_memory_is_bounded_oldest_pages_first() -> None:
    cap = MIN_CAPACITY_PAGES
    idx = index(capacity=cap)
    roots = [stored(ids(64, 1000 * i), 10 * i)[0] for i in range(cap + 100)]
    first_key = idx.stored(roots[0])[0]
    for ev in roots[1:]:
        idx.stored(ev)
    assert len(idx) <= cap
    assert idx.stats.dropped >= 4 * (cap + 100) - cap
    assert first_key not in idx
    assert idx.stored(roots[-1])[0] in idx
