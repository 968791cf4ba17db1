"""Prompts: exact token ids from the server's vocabulary, or words sized by calibration; seeded."""

from __future__ import annotations

import orjson

from diag.client import SGLangClient
from diag.prompts import PromptMaker
from tests.conftest import Emulators


def test_text_prompts_when_the_server_cannot_tokenize_are_calibrated() -> None:
    maker = PromptMaker(seed=1, max_new_tokens=1)  # no vocabulary: /tokenize was missing
    first = orjson.loads(maker.make(1000).body)
    assert "input_ids" not in first and len(first["text"].split()) == 1000
    maker.calibrate(1000, reported=2500)  # the server counted 2.5 tokens a word
    assert len(orjson.loads(maker.make(1000).body)["text"].split()) == 400
    assert not maker.token_ids


async def test_token_id_prompts_are_exact_unique_and_reproducible(emulator_server: Emulators) -> None:
    emu = await emulator_server("--emu-time-scale", "0.01")
    async with SGLangClient(emu.url) as client:
        a, b = await PromptMaker.create(client, 9, 1), await PromptMaker.create(client, 9, 1)
        other = await PromptMaker.create(client, 10, 1)
        g = await client.generate(a.make(3000).body)
    assert a.token_ids and g.prompt_tokens == 3000  # exact size as sent
    first, second = a.make(500), a.make(500)
    assert first.digest != second.digest  # every prompt of a run is new
    replay = [b.make(n).digest for n in (3000, 500, 500)]  # same seed: the same run
    assert replay[1:] == [first.digest, second.digest]
    assert other.make(500).digest != first.digest
    ids = orjson.loads(first.body)["input_ids"]
    assert len(ids) == 500 and len(set(ids)) > 300
    assert orjson.loads(first.body)["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0}
