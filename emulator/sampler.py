"""Deterministic "generation": the output tokens of a request, decided before it is scheduled.

There is no model, so the output is drawn from a seeded RNG keyed by (emulator seed, hash of the prompt
token ids, choice index, the request's own `seed`): the same request on the same emulator gets the same
text, and different choices of one request differ. Text is a sequence of short words; its token ids come
from the replica's tokenizer (either kind), so `prompt + output` is what a follow-up turn re-sends: the
output text re-encodes to the same ids (pseudo: by construction; hf: BPE cut at a token boundary).

Length rules (OpenAI routes and /generate alike):
- a max token count given → exactly that many tokens, finish reason "length";
- none given → a deterministic natural length in 16..64, finish reason "stop" (matched: the EOS id);
- a JSON constraint (structured_output.py) → the tokens of the drawn JSON text, finish reason "stop"
  (matched: EOS), or its first max-token-count tokens and "length" when that is shorter;
- `stop` strings: the text is cut before the earliest match, finish reason "stop", matched: that string;
  the token that completed the match is the last one counted.

`verify_sampling` is SGLang's `SamplingParams.verify` for the parameters the emulator reads (temperature
and top_p): a value out of range is a 400 with SGLang's message (the route picks the error shape).
"""

from __future__ import annotations

import math
import random
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from emulator.errors import ApiError
from emulator.structured_output import JsonGrammar
from emulator.tokenizer_kind import Tokenizer
from emulator.words import WORDS

EOS_TEXT = "<|im_end|>"


@dataclass(frozen=True, slots=True)
class Sampling:
    max_new: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    top_logprobs: int = 0
    grammar: JsonGrammar | None = None  # structured output (response_format / json_schema)


@dataclass(frozen=True, slots=True)
class Completion:
    """The output of one choice."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]  # text of each token; "".join(pieces) may exceed `text` after a stop cut
    text: str
    finish: str  # "stop" | "length"
    matched: str | int | None
    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[str, float], ...], ...]  # per token: alternatives with logprobs

    def text_upto(self, count: int) -> str:
        """Visible text after `count` tokens (stop-truncated at the end)."""
        if count >= len(self.ids):
            return self.text
        return "".join(self.pieces[:count])[: len(self.text)]


def verify_sampling(temperature: float | int, top_p: float | int, finite: bool = False) -> None:
    """SGLang's `SamplingParams.verify` (python/sglang/srt/sampling/sampling_params.py) for temperature and
    top_p, in its order; `finite` picks 0.5.23's temperature check (the Responses route) over 0.5.10's.

    0.5.10: `if self.temperature < 0.0: raise ValueError(f"temperature must be non-negative, got
    {self.temperature}.")`; 0.5.23: `if not math.isfinite(self.temperature) or self.temperature < 0.0:
    raise ValueError(f"temperature must be a non-negative finite number, got {self.temperature}.")`; both:
    `if not 0.0 < self.top_p <= 1.0: raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")`.
    The OpenAI routes catch the ValueError as a 400 (serving_chat/serving_completions
    `create_error_response(str(e))`), /generate as its `{"error": {"message"}}` 400. The values are
    formatted as SGLang holds them: floats after the OpenAI routes' pydantic, as sent on /generate.
    """
    if finite and not (math.isfinite(temperature) and temperature >= 0.0):
        raise ApiError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not finite and temperature < 0.0:
        raise ApiError(f"temperature must be non-negative, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ApiError(f"top_p must be in (0, 1], got {top_p}.")


class Sampler:
    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.eos_id = tokenizer.encode(EOS_TEXT)[0]

    def rng(self, prompt: Sequence[int], seed: int | None, choice: int) -> random.Random:
        """The RNG of one choice: keyed by (emulator seed, prompt ids, choice, request seed)."""
        return random.Random(self._key(prompt, seed, choice))

    def sample(self, prompt: Sequence[int], params: Sampling, choice: int) -> Completion:
        rng = self.rng(prompt, params.seed, choice)
        ids, natural = self._draw(rng, params)
        pieces = tuple(self.tokenizer.token_texts(ids))
        text = "".join(pieces)
        finish = "stop" if natural else "length"
        matched: str | int | None = self.eos_id if natural else None
        cut = _earliest(text, params.stop)
        if cut is not None:
            at, stop = cut
            ids, pieces = _keep_through(ids, pieces, at + len(stop))
            text, finish, matched = text[:at], "stop", stop
        logprobs = tuple(-round(rng.random() * 2.0, 4) for _ in ids)
        top = tuple(
            self._top(rng, p, lp, params.top_logprobs) for p, lp in zip(pieces, logprobs, strict=True)
        )
        return Completion(tuple(ids), pieces, text, finish, matched, logprobs, top)

    def _draw(self, rng: random.Random, params: Sampling) -> tuple[list[int], bool]:
        """The output ids, and whether they end naturally (at EOS) rather than at max_new."""
        if params.grammar is not None:
            ids = self.tokenizer.encode(params.grammar.draw(rng))
            if params.max_new is not None and params.max_new < len(ids):
                return ids[: params.max_new], False
            return ids, True
        if params.max_new is None:
            return self._tokens(rng, rng.randint(16, 64)), True
        return self._tokens(rng, params.max_new), False

    def _tokens(self, rng: random.Random, length: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < length:
            words = " ".join(rng.choice(WORDS) for _ in range(max(8, length)))
            ids.extend(self.tokenizer.encode(" " + words if ids else words))
        return ids[:length]

    @staticmethod
    def _top(rng: random.Random, piece: str, lp: float, k: int) -> tuple[tuple[str, float], ...]:
        alts = [(piece, lp)]
        while len(alts) < k:
            alts.append((rng.choice(WORDS), round(lp - 0.5 - rng.random(), 4)))
        return tuple(alts[:k])

    def _key(self, prompt: Sequence[int], seed: int | None, choice: int) -> int:
        h = xxhash.xxh64(seed=self.seed & 0xFFFFFFFFFFFFFFFF)
        h.update(_id_bytes(prompt))
        h.update(struct.pack("<qq", choice, -1 if seed is None else seed))
        return int(h.intdigest())


def _id_bytes(ids: Sequence[int]) -> bytes:
    try:
        return array("I", ids).tobytes()
    except OverflowError:
        return array("I", (i & 0xFFFFFFFF for i in ids)).tobytes()


def _earliest(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found) if found else None


def _keep_through(ids: list[int], pieces: tuple[str, ...], end: int) -> tuple[list[int], tuple[str, ...]]:
    """Tokens up to and including the one whose text reaches character offset `end`."""
    pos = 0
    for i, piece in enumerate(pieces):
        pos += len(piece)
        if pos >= end:
            return ids[: i + 1], pieces[: i + 1]
    return ids, pieces
