"""A deterministic pseudo-tokenizer and a ChatML chat template (no vocabulary file).

Tokenizing: one regular expression splits text into pieces, tried in this order at each position:

1. a special token (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, vision/tool markers), one token;
2. one CJK / kana / hangul character;
3. an optional space followed by 1-5 letters (so English averages about four characters a token);
4. 1-3 digits;
5. a run of 1-8 blanks other than newline;
6. any other single character (newline, punctuation, emoji, ...).

No piece ever contains a newline together with anything else, and a special token cannot be swallowed by
a neighbour, so the split of ``a + b`` is the split of ``a`` followed by the split of ``b`` whenever ``a``
ends with a newline or a special token: ``encode(a + b)`` starts with ``encode(a)``. The chat template
ends every turn with ``<|im_end|>\\n``, which is what makes a growing conversation keep its earlier tokens.

A piece's id is ``xxh32(piece, seed) mod 151_643`` (special tokens use Qwen2's ids from 151_643 up; the
vocabulary size is 151_936). ``decode`` reproduces the exact text for ids that ``encode`` produced
recently (a bounded LRU remembers id -> piece); ids it has never seen decode to a deterministic made-up
word. Two different pieces can share an id (pigeonhole: there are far more pieces than ids); decode then
returns whichever was encoded last. For ordinary prompts the chance is small (about n^2 / 300k for n
distinct pieces) and it never affects caching, which works on ids.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash

VOCAB_SIZE = 151_936
SPECIAL_TOKENS: Mapping[str, int] = {
    "<|endoftext|>": 151_643,
    "<|im_start|>": 151_644,
    "<|im_end|>": 151_645,
    "<|vision_start|>": 151_652,
    "<|vision_end|>": 151_653,
    "<|image_pad|>": 151_655,
    "<|video_pad|>": 151_656,
    "<tool_call>": 151_657,
    "</tool_call>": 151_658,
    "<|audio_pad|>": 151_659,
}
_ORDINARY_IDS = 151_643
_SEED = 0x6B76_7274  # "kvrt"
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_SPECIAL_RE = "|".join(re.escape(s) for s in sorted(SPECIAL_TOKENS, key=len, reverse=True))
_PIECE_RE = re.compile(
    rf"{_SPECIAL_RE}|[{_CJK}]| ?[^\W\d_{_CJK}]{{1,5}}|\d{{1,3}}|[^\S\n]{{1,8}}|.",
    re.DOTALL,
)
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "do", "fu", "ga", "hi", "jo", "pe", "zu")
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


class _PieceIds(dict[str, int]):
    """piece -> id, computed on first sight (``__missing__``), so ``map(ids.__getitem__, pieces)`` runs in
    C for every piece seen before and equal pieces get the very same int object."""

    def __missing__(self, piece: str) -> int:
        i = self[piece] = PseudoTokenizer.piece_id(piece)
        return i


class PseudoTokenizer:
    """Text <-> token ids, deterministic across processes; ``cache_size`` bounds the id -> piece LRU
    (and the piece -> id memo, which is dropped whenever it grows past that size)."""

    vocab_size = VOCAB_SIZE

    def __init__(self, cache_size: int = 1 << 18) -> None:
        self._cache_size = cache_size
        self._pieces: OrderedDict[int, str] = OrderedDict()
        self._ids = _PieceIds()

    @staticmethod
    def pieces(text: str) -> list[str]:
        return _PIECE_RE.findall(text)

    @staticmethod
    def piece_id(piece: str) -> int:
        special = SPECIAL_TOKENS.get(piece)
        if special is not None:
            return special
        return int(xxhash.xxh32_intdigest(piece.encode("utf-8", "surrogatepass"), _SEED)) % _ORDINARY_IDS

    def encode(self, text: str) -> list[int]:
        pieces = _PIECE_RE.findall(text)
        if len(self._ids) > self._cache_size:
            self._ids.clear()
        ids = list(map(self._ids.__getitem__, pieces))
        self._remember(ids, pieces)
        return ids

    def _remember(self, ids: list[int], pieces: list[str]) -> None:
        """Update the id -> piece LRU as if each (id, piece) were stored and moved to the end in turn:
        each id ends up holding its last piece, ordered by its last occurrence; done per distinct id."""
        cache = self._pieces
        last_piece = dict(zip(ids, pieces, strict=True))  # a later pair overwrites: the last piece wins
        by_last_use = list(dict.fromkeys(reversed(ids)))  # latest first
        for i in reversed(by_last_use):
            cache[i] = last_piece[i]
            cache.move_to_end(i)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._piece(i) for i in ids)

    def count(self, text: str) -> int:
        return len(_PIECE_RE.findall(text))

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """The text of each token (its piece)."""
        return [self._piece(i) for i in ids]

    def chat_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: object, body: Mapping[str, Any]
    ) -> list[int]:
        """The ids of ``chat_text``."""
        return self.encode(chat_text(messages, tools, body))

    def _piece(self, i: int) -> str:
        piece = self._pieces.get(i)
        if piece is not None:
            return piece
        for name, special in SPECIAL_TOKENS.items():
            if special == i:
                return name
        return unknown_word(i)


def unknown_word(token_id: int) -> str:
    """A deterministic word for an id never seen by ``encode``: a space and 1-3 syllables."""
    n = token_id % 4096
    word = _SYLLABLES[n % 16]
    n //= 16
    while n:
        word += _SYLLABLES[n % 16]
        n //= 16
    return " " + word


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def render_content(content: object) -> str:
    """A message's content: a string, None (empty) or a list of parts (text kept, media as placeholders)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_render_part(p) for p in content)
    return _json(content)


def _render_part(part: object) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        return _json(part)
    kind = part.get("type")
    if kind == "text":
        return str(part.get("text") or "")
    if kind in ("image_url", "image", "input_image"):
        return IMAGE_PLACEHOLDER
    if kind in ("video_url", "video"):
        return "<|vision_start|><|video_pad|><|vision_end|>"
    if kind in ("input_audio", "audio_url", "audio"):
        return "<|audio_pad|>"
    return _json(part)


def _render_tools(tools: Sequence[Any]) -> str:
    lines = "\n".join(_json(t) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>"
    )


def _render_tool_calls(calls: Sequence[Any]) -> str:
    out = []
    for call in calls:
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        args: object = fn.get("arguments", {}) if isinstance(fn, Mapping) else {}
        if isinstance(args, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                args = orjson.loads(args)
        name = fn.get("name") if isinstance(fn, Mapping) else None
        out.append(f"\n<tool_call>\n{_json({'name': name, 'arguments': args})}\n</tool_call>")
    return "".join(out)


def _render_message(message: Mapping[str, Any]) -> str:
    role = str(message.get("role") or "user")
    body = render_content(message.get("content"))
    if role == "assistant" and message.get("tool_calls"):
        body += _render_tool_calls(message["tool_calls"])
    if role == "tool":
        body = f"<tool_response>\n{body}\n</tool_response>"
    return f"<|im_start|>{role}\n{body}"


def chat_text(messages: Sequence[Mapping[str, Any]], tools: object, body: Mapping[str, Any]) -> str:
    """A chat request's prompt text: ``apply_chat_template`` with the tools as sent (a non-empty list,
    else none); ``continue_final_message`` leaves the last turn open and adds no generation prompt."""
    cont = bool(body.get("continue_final_message"))
    tool_list = tools if isinstance(tools, list) and tools else None
    return apply_chat_template(
        messages, tool_list, add_generation_prompt=not cont, continue_final_message=cont
    )


def apply_chat_template(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """Render messages ChatML-style; tools go into the system turn as sorted-key JSON lines.

    Each turn is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. With ``continue_final_message`` the last
    turn is left open (no ``<|im_end|>``) and no generation prompt is added; otherwise
    ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``.
    """
    msgs = list(messages)
    turns: list[str] = []
    if tools:
        system = ""
        if msgs and msgs[0].get("role") == "system":
            system = render_content(msgs.pop(0).get("content")) + "\n\n"
        turns.append(f"<|im_start|>system\n{system}{_render_tools(tools)}")
    turns += [_render_message(m) for m in msgs]
    if continue_final_message and turns:
        return "".join(t + "<|im_end|>\n" for t in turns[:-1]) + turns[-1]
    text = "".join(t + "<|im_end|>\n" for t in turns)
    return text + "<|im_start|>assistant\n" if add_generation_prompt else text
