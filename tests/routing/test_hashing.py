"""Chained block hashes: shared prefixes share leading hashes, and only they do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.config import RoutingConfig
from routing.hashing import block_hashes, build_request

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


def test_build_request_estimates_tokens_and_keeps_session_and_salt() -> None:
    cfg = RoutingConfig(block_chars=16, chars_per_token=4.0)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x" * 400}],
        "max_tokens": 7,
        "cache_salt": "s",
    }
    req, size = build_request("/v1/chat/completions", body, cfg, session_key="abc")
    assert size > 400 and req.prompt_tokens == round(size / 4.0)
    assert len(req.block_hashes) == size // 16
    assert req.block_tokens == 4.0 and req.session_key == "abc" and req.max_new_tokens == 7
    other, _ = build_request("/v1/chat/completions", {**body, "cache_salt": "t"}, cfg)
    assert not set(req.block_hashes) & set(other.block_hashes)
    learned, _ = build_request("/v1/chat/completions", body, cfg, chars_per_token=2.0)
    assert learned.prompt_tokens == round(size / 2.0) and learned.block_tokens == 8.0
