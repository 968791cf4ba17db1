"""The one tokenizer interface of the emulator and the choice between its two kinds (``--emu-tokenizer``).

``pseudo`` (the default): emulator/tokenizer.py's deterministic pseudo-tokenizer and Python ChatML
renderer, per replica (it remembers id -> piece). ``hf``: the real tokenizer directory named by
``--tokenizer-path`` (default: the model path), emulator/hf_tokenizer.py, shared by the replicas of a
process. Route handlers, the sampler and tool calls only use the methods below, for either kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from emulator.hf_tokenizer import load
from emulator.tokenizer import PseudoTokenizer

KINDS = ("pseudo", "hf")


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]:
        """A text prompt's token ids (completions, /generate ``text``, /tokenize, sampled outputs)."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """The text of each token of an output; their concatenation is the output's text."""
        ...

    def chat_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: object, body: Mapping[str, Any]
    ) -> list[int]:
        """A chat request's prompt token ids (``body`` supplies continue_final_message, tool_choice,
        chat_template_kwargs)."""
        ...


def make_tokenizer(kind: str, path: str) -> Tokenizer:
    if kind == "hf":
        return load(path)
    if kind == "pseudo":
        return PseudoTokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r} (one of {', '.join(KINDS)})")
