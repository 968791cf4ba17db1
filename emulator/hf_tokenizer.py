"""A real tokenizer directory (``--emu-tokenizer hf``), loaded as SGLang loads ``--tokenizer-path``.

``tokenizer.json`` through the HF ``tokenizers`` library; the chat template from ``chat_template.jinja``
or ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{name, template}`` of which
``default`` is used), rendered by emulator/chat_template.py. The token ids of a request:

- chat: ``encode(render(messages), add_special_tokens=False)`` (HF's ``apply_chat_template(...,
  tokenize=True)``), plus ``encode(prefix)`` without a leading BOS for ``continue_final_message``;
- text (completions, /generate ``text``, /tokenize): ``encode(text)`` (the tokenizer's own special-token
  handling, as SGLang's tokenizer manager calls it);
- token ids: as given.

``decode`` keeps special tokens (the emulator's outputs carry none).

Chat prompts are encoded piecewise: ``tokenizers`` cuts the text at added tokens before it pre-tokenizes,
so ``encode(a + special + b) == encode(a) + [special] + encode(b)`` when no added token strips its
neighbours (``lstrip``/``rstrip``/``single_word``) and there is no normalizer. The pieces between added
tokens (a turn's content, mostly) are remembered in a bounded LRU, so a growing conversation encodes only
its new turns; any other tokenizer encodes the whole text at once.
"""

from __future__ import annotations

import functools
import json
import re
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from emulator.chat_template import NO_TEMPLATE, ChatTemplate, sglang_tools
from emulator.errors import ApiError

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value: object) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(config: Mapping[str, Any]) -> dict[str, Any]:
    """HF's special_tokens_map as template variables: the string-valued special tokens of the config."""
    out: dict[str, Any] = {k: t for k in SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t for e in extra if (t := _token_text(e)) is not None]
    return out


def template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
    return source if isinstance(source, str) else None


SEGMENT_CACHE_TOKENS = 4_000_000


class SegmentEncoder:
    """``encode(text, add_special_tokens=False)`` as the concatenation of the encodings of the text's
    pieces between added tokens; those pieces' ids are kept in an LRU of at most ``budget`` tokens."""

    def __init__(self, tokenizer: Tokenizer, budget: int = SEGMENT_CACHE_TOKENS) -> None:
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        plain = not any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values())
        self.exact = plain and tokenizer.normalizer is None and bool(added)
        self.ids = {t.content: i for i, t in added.items()}
        alternatives = "|".join(re.escape(c) for c in sorted(self.ids, key=len, reverse=True))
        self.split = re.compile(f"({alternatives})") if added else None
        self.budget = budget
        self.cached = 0
        self.cache: OrderedDict[str, array[int]] = OrderedDict()

    def encode(self, text: str) -> list[int]:
        if not self.exact or self.split is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        for k, piece in enumerate(self.split.split(text)):
            if k % 2:
                out.append(self.ids[piece])
            elif piece:
                out.extend(self._piece(piece))
        return out

    def _piece(self, piece: str) -> array[int]:
        ids = self.cache.get(piece)
        if ids is not None:
            self.cache.move_to_end(piece)
            return ids
        ids = array("I", self.tokenizer.encode(piece, add_special_tokens=False).ids)
        self.cache[piece] = ids
        self.cached += len(ids)
        while self.cached > self.budget and len(self.cache) > 1:
            self.cached -= len(self.cache.popitem(last=False)[1])
        return ids


class HfTokenizer:
    """The tokenizer of one directory (``tokenizer.json`` + ``tokenizer_config.json``)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        self.segments = SegmentEncoder(self.tokenizer)
        config_file = self.directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        source = template_source(self.directory, config)
        self.template = None if source is None else ChatTemplate(source, special_tokens(config))
        bos = _token_text(config.get("bos_token"))
        self.bos_id = None if bos is None else self.tokenizer.token_to_id(bos)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """The text each token adds, so that ``"".join`` of them is ``decode(ids)``: incremental
        detokenization (a token that ends inside a UTF-8 character adds "" and the next one the character)."""
        out: list[str] = []
        prefix, read = 0, 0  # the window decode(ids[prefix:read]) already emitted
        for k in range(len(ids)):
            done = self.decode(ids[prefix:read])
            text = self.decode(ids[prefix : k + 1])
            if k + 1 < len(ids) and (len(text) <= len(done) or text.endswith("\ufffd")):
                out.append("")
                continue
            out.append(text[len(done) :])
            prefix, read = read, k + 1
        return out

    def chat_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: object, body: Mapping[str, Any]
    ) -> list[int]:
        """A chat request's prompt token ids, as SGLang computes them (module docstring)."""
        msgs, prefix = self._split(messages, body)
        text = self._render(msgs, tools, body)
        ids = self.segments.encode(text)
        if prefix:
            tail = self.encode(prefix)
            ids += tail[1:] if tail and tail[0] == self.bos_id else tail
        return ids

    def _split(
        self, messages: Sequence[Mapping[str, Any]], body: Mapping[str, Any]
    ) -> tuple[list[dict[str, Any]], str | None]:
        if self.template is None:
            raise ApiError(NO_TEMPLATE, 400, "BadRequest")
        msgs = self.template.messages(messages)
        if not msgs or msgs[-1].get("role") != "assistant" or not isinstance(msgs[-1].get("content"), str):
            return msgs, None
        content = msgs[-1]["content"]
        if body.get("continue_final_message"):
            return msgs[:-1], content
        return [*msgs[:-1], {"role": "user", "content": content}], None  # SGLang: a final turn is the user's

    def _render(self, msgs: list[dict[str, Any]], tools: object, body: Mapping[str, Any]) -> str:
        assert self.template is not None
        extra = body.get("chat_template_kwargs")
        kwargs = {
            "reasoning_effort": body.get("reasoning_effort"),
            **(extra if isinstance(extra, dict) else {}),
        }
        functions = sglang_tools(tools, body.get("tool_choice", "auto"))
        return self.template.render_request(msgs, functions, kwargs)


@functools.lru_cache(maxsize=8)
def load(directory: str) -> HfTokenizer:
    """One tokenizer per directory and process (the replicas of one process share it)."""
    return HfTokenizer(directory)
