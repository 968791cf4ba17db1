"""The gateway's tokenizer (``--tokenizer-path DIR``): a request's prompt as the engine's token ids.

``DIR`` is what SGLang's ``--tokenizer-path`` takes: ``tokenizer.json`` (loaded with the HF
``tokenizers`` library) and ``tokenizer_config.json`` (its ``chat_template`` and special tokens,
``proxy/exact/chat_template.py``). Token ids as SGLang computes them:

- chat: the rendered template, ``encode(text, add_special_tokens=False)`` (SGLang adds no specials to a
  rendered chat: the template holds them); a chat body's own ``input_ids`` are used as they are;
- completions / ``/generate`` text: ``encode(text)`` with the default ``add_special_tokens=True`` (SGLang's
  ``tokenizer.encode(text)``). For a tokenizer without a post-processor (``emulator/model_bpe``) the two
  agree; for one that adds a BOS the text prompt gets it, as in SGLang.

The ids become a ``routing.prompt.TokenPrompt``: routing keys it with ``token_block_hashes``, the keys
the replicas' KV events are matched with. A request that cannot be rendered (template error, multimodal
parts) keeps its typed prompt, and text keys; it is counted by reason.

Off the critical path: a chat's ids are assembled from the longest cached rendered prefix
(``proxy/exact/prefix_cache.py``; a growing conversation encodes only its new turns) and the new text is
encoded on the event loop when it is short, in a thread (``asyncio.to_thread``; ``tokenizers`` releases
the GIL while it encodes) when it is longer than ``THREAD_CHARS``. A text prompt takes the same path
when the specials its encode adds are fixed ids around the text's own (``special_wrap``: a BOS, an EOS,
or none), so a long document before new questions is encoded once; else it is encoded whole. The caches
are read and written on the event loop only. No prompt text is kept: the caches' keys are hashes of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from proxy.exact.chat_template import ChatTemplate, Unrenderable
from proxy.exact.paragraph_cache import SEGMENT_CHARS, ParagraphCache, Pieces, cuts_are_exact, special_wrap
from proxy.exact.prefix_cache import Key, PrefixCache, cut_keys
from proxy.types import ParsedRequest
from routing.prompt import ChatPrompt, TextPrompt, TokenPrompt

log = logging.getLogger("kvroute.tokenizer")
THREAD_CHARS = 8192  # new text longer than this is encoded in a thread (~2.5 ms of encoding at 3.4 MB/s)
THREAD_IDS = 32768  # ... and so is a prompt with more cached ids than this (~1.3 ms to copy them out)
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "additional_special_tokens")


class TokenizerError(ValueError):
    """The tokenizer directory cannot be loaded (a startup error: ``kvroute serve`` exits with 2)."""


@dataclass(slots=True)
class _Plan:
    """How one text's ids are assembled: ``base`` (cached ids of ``text[:start]``), then the ids of
    ``text[start:cut]`` (``head``, stored under ``key`` afterwards), then those of ``text[cut:]``
    (``tail``); a long part is in ``head_pieces`` / ``tail_pieces`` (``proxy/exact/paragraph_cache.py``), its
    cached paragraphs already found."""

    base: array[int]
    key: Key | None
    head: str  # text[start:cut] when it is stored under key, else ""
    tail: str  # text[max(start, cut):]
    head_pieces: Pieces | None = None
    tail_pieces: Pieces | None = None

    def todo(self) -> tuple[list[str], list[str]]:
        """The texts left to encode, of the head and of the tail."""
        head = self.head_pieces.missing if self.head_pieces else [self.head] if self.head else []
        return head, self.tail_pieces.missing if self.tail_pieces else [self.tail]


@dataclass(slots=True)
class _Encoded:
    prefix: array[int]  # ids of text[:cut]
    ids: tuple[int, ...]  # all the ids
    fresh: tuple[list[array[int]], list[array[int]]] = ([], [])  # new paragraphs' ids (head, tail)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(config: dict[str, Any]) -> dict[str, Any]:
    """The template's special-token variables (transformers' ``special_tokens_map``), the set ones."""
    out: dict[str, Any] = {}
    for name in _SPECIAL_NAMES:
        value = config.get(name)
        if isinstance(value, list):
            out[name] = [t for t in map(_token_text, value) if t is not None]
        elif _token_text(value) is not None:
            out[name] = _token_text(value)
    return out


class PromptTokenizer:
    """See the module docstring."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None, cache: PrefixCache) -> None:
        self._tok = tokenizer
        self.template = template
        self.cache = cache
        specials = [t.content for t in tokenizer.get_added_tokens_decoder().values() if _splits(t)]
        alternatives = "|".join(map(re.escape, sorted(specials, key=len, reverse=True)))
        self._cuts = re.compile(alternatives) if alternatives else None
        self.paragraphs = ParagraphCache() if cuts_are_exact(self._encode_many) else None
        self._wrap = special_wrap(self._encode_many)  # a text prompt's specials around its own ids
        self.counts: Counter[str] = Counter()  # tokenized, ids, fallback_<reason>
        self.observe: Callable[[str, float], None] | None = None  # (mode, seconds) of each tokenizing

    @classmethod
    def load(cls, path: str, cache: PrefixCache | None = None) -> PromptTokenizer:
        try:
            tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
            config_path = os.path.join(path, "tokenizer_config.json")
            config: dict[str, Any] = {}
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise TokenizerError(f"cannot load the tokenizer in {path!r}: {e}") from None
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: transformers uses "default"
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        template = ChatTemplate(source, _special_tokens(config)) if isinstance(source, str) else None
        return cls(tok, template, cache if cache is not None else PrefixCache())

    def with_cache(self, cache: PrefixCache) -> PromptTokenizer:
        """The same tokenizer and template over another prefix cache (benchmarks, tests)."""
        return PromptTokenizer(self._tok, self.template, cache)

    # ---- text -----------------------------------------------------------------------------------------
    def chat_text(self, body: dict[str, Any]) -> str:
        """The rendered chat prompt (``proxy/exact/chat_template.py``); raises ``Unrenderable``."""
        if self.template is None:
            raise Unrenderable("no_template")
        return self.template.render(body)

    # ---- ids ------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """A direct encode (no cache); thread-safe."""
        return self._encode_many([text], add_special_tokens)[0]

    def _encode_many(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Direct encodes of several texts, in one call; thread-safe."""
        if not texts:
            return []
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]

    def chat_ids(self, text: str) -> tuple[int, ...]:
        """The ids of a rendered chat, with the prefix cache, on the calling thread."""
        plan = self._plan(text)
        return self._finish(plan, self._encode(plan))

    def text_ids(self, text: str) -> tuple[int, ...]:
        """The ids of a text prompt (``encode(text)``, specials added), on the calling thread."""
        return tuple(self.encode(text, True)) if self._wrap is None else self._wrapped(self.chat_ids(text))

    def _wrapped(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        """A text prompt's ids: its encode's specials (``_wrap``, not None here) around its text's ids."""
        assert self._wrap is not None
        pre, post = self._wrap
        return (*pre, *ids, *post)

    async def ids_async(self, text: str, chat: bool) -> tuple[tuple[int, ...], bool]:
        """(the ids of a rendered chat or of a text prompt, whether a thread computed them): in a thread
        when the uncached text is long or the cached ids many (``_threaded``). A text prompt goes through
        the caches too when the specials its encode adds are fixed ids around the text's own
        (``_wrap``): a long document before new questions is encoded once."""
        if not chat and self._wrap is None:
            if len(text) <= THREAD_CHARS:
                return tuple(self.encode(text, True)), False
            return tuple(await asyncio.to_thread(self.encode, text, True)), True
        plan = self._plan(text)
        if not _threaded(plan):
            ids, threaded = self._finish(plan, self._encode(plan)), False
        else:
            ids, threaded = self._finish(plan, await asyncio.to_thread(self._encode, plan)), True
        return (ids if chat else self._wrapped(ids)), threaded

    def _plan(self, text: str) -> _Plan:
        cuts = [m.end() for m in self._cuts.finditer(text)] if self._cuts is not None else []
        keys = list(cut_keys(text, cuts))
        hit = self.cache.longest(keys) if keys else None
        base, start = (hit[1], hit[0][1]) if hit is not None else (array("I"), 0)
        cut = cuts[-1] if cuts else 0
        key = keys[-1] if cut > start else None
        plan = _Plan(base, key, text[start:cut] if key is not None else "", text[max(start, cut) :])
        if self.paragraphs is not None:
            plan.head_pieces = self.paragraphs.pieces(plan.head) if len(plan.head) > SEGMENT_CHARS else None
            plan.tail_pieces = self.paragraphs.pieces(plan.tail) if len(plan.tail) > SEGMENT_CHARS else None
        return plan

    def _encode(self, plan: _Plan) -> _Encoded:
        """The ids (``_Encoded``): reads only immutable values, so it may run in a thread (the cached
        arrays are never changed in place)."""
        head, tail = plan.todo()
        encoded = self._encode_many([*head, *tail])
        h, fresh_h = _joined(plan.head_pieces, encoded[: len(head)])
        t, fresh_t = _joined(plan.tail_pieces, encoded[len(head) :])
        prefix = plan.base + h if plan.key is not None else plan.base
        return _Encoded(prefix, tuple(prefix) + tuple(t), (fresh_h, fresh_t))

    def _finish(self, plan: _Plan, done: _Encoded) -> tuple[int, ...]:
        if plan.key is not None:
            self.cache.put(plan.key, done.prefix)
        if self.paragraphs is not None:
            for pieces, fresh in zip((plan.head_pieces, plan.tail_pieces), done.fresh, strict=True):
                if pieces is not None:
                    self.paragraphs.store(pieces, fresh)
        return done.ids

    # ---- requests -------------------------------------------------------------------------------------
    async def tokenized(self, parsed: ParsedRequest) -> ParsedRequest:
        """``parsed`` with its prompt as the engine's token ids, when it can be rendered (else as it is)."""
        t0 = time.perf_counter()
        try:
            source = self._source(parsed)
            if not isinstance(source, tuple):
                return parsed if source is None else self._with(parsed, source)
            ids, threaded = await self.ids_async(*source)
        except Exception as e:
            return self._fallback(parsed, e)
        return self._done(parsed, ids, t0, "thread" if threaded else "inline")

    def tokenized_now(self, parsed: ParsedRequest) -> ParsedRequest:
        """``tokenized`` on the calling thread (a warm-up's placement, which is not on a request path)."""
        t0 = time.perf_counter()
        try:
            source = self._source(parsed)
            if not isinstance(source, tuple):
                return parsed if source is None else self._with(parsed, source)
            text, chat = source
            ids = self.chat_ids(text) if chat else self.text_ids(text)
        except Exception as e:
            return self._fallback(parsed, e)
        return self._done(parsed, ids, t0, "inline")

    def _fallback(self, parsed: ParsedRequest, e: Exception) -> ParsedRequest:
        """A request that keeps its text keys, counted by reason: it cannot be rendered (``Unrenderable``),
        or the tokenizer itself failed on its text (logged, never failing the request)."""
        if isinstance(e, Unrenderable):
            self.counts["fallback_" + e.reason] += 1
        else:
            log.exception("tokenizing a request failed; it keeps its text keys", exc_info=e)
            self.counts["fallback_error"] += 1
        return parsed

    def _source(self, parsed: ParsedRequest) -> tuple[str, bool] | TokenPrompt | None:
        """(the text to encode, whether it is a rendered chat); a chat body's own ``input_ids``; or None
        when there is nothing to do (no prompt, or token ids already)."""
        prompt = parsed.routing.prompt
        if isinstance(prompt, ChatPrompt):
            given = parsed.body.get("input_ids")
            if isinstance(given, list) and given and all(type(t) is int for t in given):
                self.counts["ids"] += 1
                return TokenPrompt(tuple(given))
            return self.chat_text(parsed.body), True
        if isinstance(prompt, TextPrompt):
            return prompt.text, False
        if isinstance(prompt, TokenPrompt):
            self.counts["ids"] += 1
        return None

    def _done(self, parsed: ParsedRequest, ids: tuple[int, ...], t0: float, mode: str) -> ParsedRequest:
        self.counts["tokenized"] += 1
        out = self._with(parsed, TokenPrompt(ids))
        if self.observe is not None:
            self.observe(mode, time.perf_counter() - t0)
        return out

    @staticmethod
    def _with(parsed: ParsedRequest, prompt: TokenPrompt) -> ParsedRequest:
        return dataclasses.replace(parsed, routing=dataclasses.replace(parsed.routing, prompt=prompt))


def _joined(pieces: Pieces | None, encoded: list[list[int]]) -> tuple[array[int], list[array[int]]]:
    """A part's ids from its pieces and their encoded misses (or from its one encode), and the new ones."""
    if pieces is None:
        return array("I", encoded[0] if encoded else ()), []
    return pieces.assemble(encoded)


def _threaded(plan: _Plan) -> bool:
    """Long new text (``THREAD_CHARS``), or many cached ids to copy into the prompt (``THREAD_IDS``)."""
    return sum(len(t) for part in plan.todo() for t in part) > THREAD_CHARS or len(plan.base) > THREAD_IDS


def _splits(token: Any) -> bool:
    """An added token that the tokenizer always splits out exactly (no whitespace stripping)."""
    return bool(token.special and not token.lstrip and not token.rstrip and not token.single_word)
