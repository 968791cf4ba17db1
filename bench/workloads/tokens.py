"""A workload's prompts as the emulated replicas tokenize them: the oracle routes on these ids and the
floor counts them (``bench/workloads/floor.py``), so both see the tokens the fleet computes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from emulator.hf_tokenizer import HfTokenizer
from emulator.tokenizer import PseudoTokenizer, chat_text


class SegmentTokenizer:
    """The emulator's `PseudoTokenizer.encode`, cached per line.

    Text is cut after each newline: the emulator's tokenizer never lets a piece cross a newline (nor a
    special token), so the concatenated ids equal `encode(text)`. A conversation that grows by one turn,
    or a document asked about with another question after it, re-tokenizes only its new lines (bounded
    LRU of lines).
    """

    def __init__(self, size: int = 65_536) -> None:
        self._tokenizer = PseudoTokenizer()
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._size = size

    def chat_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: object, body: Mapping[str, Any]
    ) -> list[int]:
        """``PseudoTokenizer.chat_ids`` with this cached encode."""
        return self.encode(chat_text(messages, tools, body))

    def encode(self, text: str) -> list[int]:
        parts = text.split("\n")
        segments = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        ids: list[int] = []
        for segment in segments:
            ids.extend(self._segment(segment))
        return ids

    def _segment(self, segment: str) -> list[int]:
        cached = self._cache.get(segment)
        if cached is not None:
            self._cache.move_to_end(segment)
            return cached
        ids = self._tokenizer.encode(segment)
        self._cache[segment] = ids
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return ids


PromptTokenizer = SegmentTokenizer | PseudoTokenizer | HfTokenizer  # whatever a replica tokenizes with


def token_ids(tokenizer: PromptTokenizer, path: str, body: dict[str, Any]) -> list[int] | None:
    """A request's prompt ids as a replica with ``tokenizer`` computes them (None: neither a chat nor a
    text completion)."""
    if path == "/v1/chat/completions" and isinstance(body.get("messages"), list):
        return tokenizer.chat_ids(body["messages"], body.get("tools"), body)
    if path == "/v1/completions" and isinstance(body.get("prompt"), str):
        return tokenizer.encode(body["prompt"])
    return None
