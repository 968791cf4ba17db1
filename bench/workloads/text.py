"""Seeded synthetic text: words, documents and token estimates (no data downloads).

A `WordSource` draws pseudo-English words from a fixed syllable inventory with its own
`random.Random(seed)`, so the same seed always yields the same bytes. Lengths are asked for in
*tokens*: `estimate_tokens` counts pieces the way the emulator's pseudo-tokenizer cuts plain text
(an optional space and 1-5 letters, 1-3 digits, a run of blanks, any other single character), so a
"4K-token document" is about 4K tokens on the replica too. The runner records the replica's own
`prompt_tokens`; the estimate only sizes workloads.
"""

from __future__ import annotations

import random
import re

_PIECE = re.compile(r" ?[^\W\d_]{1,5}|\d{1,3}|[^\S\n]{1,8}|.", re.DOTALL)
_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "st")


def estimate_tokens(text: str) -> int:
    """Token count under the emulator's piece rule for plain (non-CJK, no special tokens) text."""
    return len(_PIECE.findall(text))


class WordSource:
    """Seeded generator of words, sentences and documents of a requested token length."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._lexicon = [self._make_word() for _ in range(4096)]

    def _make_word(self) -> str:
        syllables = self._rng.choice((1, 1, 2, 2, 2, 3))
        parts = [self._rng.choice(_ONSETS) + self._rng.choice(_NUCLEI) for _ in range(syllables)]
        return "".join(parts) + self._rng.choice(_CODAS)

    @property
    def rng(self) -> random.Random:
        return self._rng

    def words(self, tokens: int) -> str:
        """Space-separated words whose estimated token count is close to (at least) `tokens`."""
        out: list[str] = []
        count = 0
        while count < tokens:
            word = self._rng.choice(self._lexicon)
            out.append(word)
            count += estimate_tokens(" " + word)
        return " ".join(out)

    def sentences(self, tokens: int) -> str:
        """Words grouped into sentences (a capital, 6-18 words, a full stop), about `tokens` long."""
        out: list[str] = []
        count = 0
        while count < tokens:
            n = self._rng.randint(6, 18)
            sentence = " ".join(self._rng.choice(self._lexicon) for _ in range(n))
            sentence = sentence[0].upper() + sentence[1:] + "."
            out.append(sentence)
            count += estimate_tokens(sentence) + 1
        return " ".join(out)

    def document(self, title: str, tokens: int) -> str:
        """A titled document of paragraphs, about `tokens` long."""
        paragraphs: list[str] = [f"# {title}"]
        remaining = tokens - estimate_tokens(title) - 3
        while remaining > 0:
            size = min(remaining, self._rng.randint(120, 400))
            para = self.sentences(size)
            paragraphs.append(para)
            remaining -= estimate_tokens(para) + 2
        return "\n\n".join(paragraphs)
