"""Hypothesis over the OpenAI request schema (``bench.labs.fuzz_bodies``: valid-ish chat and completions
bodies with random types, missing and unknown fields, weird unicode, big numbers, nulls) through a real
gateway with the response cache on: no kvroute-made 5xx, every rejection OpenAI-shaped, and the gateway
still serves afterwards. ``python -m bench.labs.fuzz`` sends 10,000 of them to a gateway process."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.labs.fuzz_bodies import body
from tests.proxy.badinput import assert_clean, assert_serves, send
from tests.proxy.conftest import Stack, StackFactory


@pytest.fixture
async def fuzz_stack(stack_factory: StackFactory) -> Stack:
    return await stack_factory(n=2, response_cache="memory")


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rng=st.randoms(use_true_random=False))
async def test_generated_bodies_never_get_a_kvroute_5xx(fuzz_stack: Stack, rng: random.Random) -> None:
    path, raw = body(rng)
    status, answer, headers = await send(fuzz_stack.url, path, raw)
    assert_clean(status, answer, headers, raw[:300])


async def test_the_gateway_serves_after_the_fuzzing(fuzz_stack: Stack) -> None:
    rng = random.Random(7)
    for _ in range(50):
        path, raw = body(rng)
        status, answer, headers = await send(fuzz_stack.url, path, raw)
        assert_clean(status, answer, headers, raw[:300])
    await assert_serves(fuzz_stack.url)
