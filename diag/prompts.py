"""Unique random prompts of a given token count, as /generate bodies (the text is never logged).

A run's random generator is seeded from the clock unless ``--seed`` is given. Random pseudo-words
(syllables) make a vocabulary sample, which the server tokenizes once (``/v1/tokenize`` or
``/tokenize``) into a pool of valid token ids; each prompt is then ``n`` ids drawn from that pool, sent
as ``input_ids``. So every prompt has exactly ``n`` tokens, no prompt shares a prefix with another beyond
chance, and the timed requests do not include tokenization. Without a tokenize endpoint, prompts are
random words sent as ``text``, sized with a words-per-token ratio that ``calibrate`` corrects from the
``prompt_tokens`` the server reports.

A prompt is identified in reports by ``digest``: the first 16 hex digits of the xxh3-64 hash of its body.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import xxhash

from diag.client import SGLangClient

SYLLABLES = tuple(c + v for c in "bdfghjklmnprstvz" for v in "aeiou")
SAMPLE_WORDS = 4000


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: int  # planned prompt tokens (exact when sent as ids)
    body: bytes  # the encoded /generate request, streamed

    @property
    def digest(self) -> str:
        return xxhash.xxh3_64_hexdigest(self.body)[:16]


def random_words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(n)]


class PromptMaker:
    """Makes prompts from one seeded generator: token ids from ``vocab``, or words when it is empty."""

    def __init__(self, seed: int, max_new_tokens: int, vocab: Sequence[int] = ()) -> None:
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self._rng = random.Random(seed)
        self._vocab = tuple(vocab)
        self.words_per_token = 1.0

    @classmethod
    async def create(cls, client: SGLangClient, seed: int, max_new_tokens: int) -> PromptMaker:
        sample = " ".join(random_words(random.Random(seed ^ 0x5EED), SAMPLE_WORDS))
        ids = await client.tokenize(sample)
        return cls(seed, max_new_tokens, sorted(set(ids or ())))

    @property
    def token_ids(self) -> bool:
        """Whether prompts are sent as token ids (exact sizes, no tokenization in the TTFT)."""
        return bool(self._vocab)

    def make(self, tokens: int) -> Prompt:
        params = {"max_new_tokens": self.max_new_tokens, "temperature": 0.0}
        body: dict[str, object] = {"sampling_params": params, "stream": True}
        if self._vocab:
            body["input_ids"] = self._rng.choices(self._vocab, k=tokens)
        else:
            body["text"] = " ".join(random_words(self._rng, max(1, round(tokens * self.words_per_token))))
        return Prompt(tokens, orjson.dumps(body))

    def calibrate(self, planned: int, reported: int | None) -> None:
        """Text prompts only: corrects words per token from a prompt the server counted."""
        if not self._vocab and reported:
            self.words_per_token *= planned / reported
