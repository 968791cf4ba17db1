"""Chained block hashes: shared prefixes share leading hashes, and only they do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.hashing import block_hashes

BC = 8
alphabet = st.text(alphabet="abcde", min_size=0, max_size=120)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(alphabet, alphabet)
def test_leading_hashes_are_shared_exactly_as_far_as_full_blocks_are_shared(x: str, y: str) -> None:
    hx = block_hashes("m", x, "", BC, 1000)
    hy = block_hashes("m", y, "", BC, 1000)
    shared_chars = _common(tuple(map(ord, x)), tuple(map(ord, y)))
    full_blocks = min(shared_chars // BC, len(hx), len(hy))
    assert _common(hx, hy) == full_blocks


@settings(max_examples=100, deadline=None)
@given(alphabet, alphabet)
def test_a_longer_prompt_keeps_every_hash_of_its_prefix(x: str, suffix: str) -> None:
    short = block_hashes("m", x, "s", BC, 1000)
    long = block_hashes("m", x + suffix, "s", BC, 1000)
    assert long[: len(short)] == short
    assert len(short) == len(x) // BC


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="xyz", min_size=BC, max_size=64))
def test_salt_and_model_separate_every_block(x: str) -> None:
    base = block_hashes("m", x, "", BC, 1000)
    assert not set(base) & set(block_hashes("m", x, "tenant", BC, 1000))
    assert not set(base) & set(block_hashes("other-model", x, "", BC, 1000))
    assert base == block_hashes("m", x, "", BC, 1000)


def test_partial_block_and_max_blocks() -> None:
    assert block_hashes("m", "a" * (BC - 1), "", BC, 10) == ()
    assert len(block_hashes("m", "a" * (BC * 5 + 3), "", BC, 10)) == 5
    assert len(block_hashes("m", "a" * (BC * 50), "", BC, 7)) == 7
    # identical blocks at different positions hash differently: the chain carries the position
    h = block_hashes("m", "a" * (BC * 3), "", BC, 10)
    assert len(set(h)) == 3


def test_utf8_blocks_count_bytes() -> None:
    assert len(block_hashes("m", "é" * BC, "", BC, 10)) == 2  # 2 bytes per character
    assert block_hashes("m", "é" * BC, "", BC, 10) == block_hashes("m", ("é" * BC).encode(), "", BC, 10)


def test_token_block_hashes_chain_from_a_known_parent() -> None:
    import struct

    import xxhash

    from routing.hashing import chain_seed, token_block_hashes

    ids = list(range(1000, 1000 + 40))
    full = token_block_hashes("m", ids, "", 16, 100)
    assert len(full) == 2  # the trailing 8 tokens are no full block
    first = xxhash.xxh3_64_intdigest(struct.pack("<16I", *ids[:16]), chain_seed("m", ""))
    assert full[0] == first
    assert token_block_hashes("m", ids[16:], "", 16, 100, seed=full[0]) == full[1:]
    assert token_block_hashes("m", ids, "tenant", 16, 100)[0] != first
    assert token_block_hashes("m", ids, "", 16, 1) == full[:1]
