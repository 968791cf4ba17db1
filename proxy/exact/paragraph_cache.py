"""A bounded LRU cache of the token ids of paragraphs: long new text is encoded a paragraph at a time.

Why it can be exact: a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen) pre-tokenizes with a regex
whose word pattern takes at most a space or a punctuation mark before a run of letters, never a newline.
So a letter right after a newline starts a pre-token, no BPE merge crosses that point, and
``ids(text) == ids(text[:i]) + ids(text[i:])`` there. Not every tokenizer works so (SentencePiece adds a
prefix space to each piece, some normalizers look across characters): ``cuts_are_exact`` tries the
loaded tokenizer on ``PROBES`` at start-up, and ``proxy/exact/tokenizer.py`` uses the cache only when every
probe holds (else it encodes text whole, as before).

Why it helps: the prefix cache (``proxy/exact/prefix_cache.py``) reuses whole turns, but RAG frameworks put
the document in the user message before the question, and hot traffic sends one document with notes of its
own: the turn is new each time, and encoding its ~6-16K tokens was most of the gateway's CPU (py-spy on
bench.exact's hot: 40% of the gateway's samples in the encoder). Here a text is cut at the first such
point after every ``SEGMENT_CHARS`` characters, each segment keyed by the ``xxh3_128`` of its text (no
text is kept), so the same document gives the same segments and only the segments around the question
are encoded.

Text prompts (completions, ``/generate``) are encoded with the specials the tokenizer's post-processor
adds (a BOS, an EOS); ``special_wrap`` finds them on the probes when they are fixed ids around the text's
own, so a text prompt's ids are those specials around the cached ids of its text.

Bounds: at most ``max_entries`` segments and ``max_ids`` ids (least recently used evicted first). The
cache is read and written on the event loop only; encoding the misses may run in a thread.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

import xxhash

from proxy.exact.prefix_cache import IdsLru

SEGMENT_CHARS = 2048  # a segment ends at the first exact cut after this many characters
PROBES = (
    "Hello world.\nNext line, here.\n\nA new paragraph: it's done.\n  Indented\nend",
    "x = foo(1)\n\treturn y\nclass Z:\n    pass\nÉté à Zürich\n日本語のテキスト\nok",
    "Numbers 123\n456 and\n\n\nthree blank lines\n- a list\nitem two\n'quoted'\nword",
)

Encode = Callable[[list[str]], list[list[int]]]


def cuts(text: str, every: int = SEGMENT_CHARS) -> list[int]:
    """Cut points: the first position after each ``every`` characters that follows a newline and holds a
    letter (ascending, excluding 0 and ``len(text)``)."""
    out: list[int] = []
    pos = every
    while pos < len(text):
        j = text.find("\n", pos - 1)
        while j != -1 and j + 1 < len(text) and not text[j + 1].isalpha():
            j = text.find("\n", j + 1)
        if j == -1 or j + 1 >= len(text):
            break
        out.append(j + 1)
        pos = j + 1 + every
    return out


def split(text: str, points: Sequence[int]) -> list[str]:
    """``text`` cut at ``points`` (ascending)."""
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def cuts_are_exact(encode: Encode) -> bool:
    """Whether the tokenizer's ids are the same with the text cut at every such point (``PROBES``)."""
    for text in PROBES:
        whole, *parts = encode([text, *split(text, cuts(text, 1))])
        if whole != [i for p in parts for i in p]:
            return False
    return True


def special_wrap(encode: Callable[..., list[list[int]]]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids a text encode adds before and after the text's own (a BOS, an EOS: the post-processor's),
    when they are the same for every probe (``PROBES``); None when they are not (the text path then
    keeps its one direct encode)."""
    plain, full = encode(list(PROBES)), encode(list(PROBES), True)
    n, whole = len(plain[0]), full[0]
    k = next((k for k in range(len(whole) - n + 1) if whole[k : k + n] == plain[0]), None)
    if k is None:
        return None
    pre, post = tuple(whole[:k]), tuple(whole[k + n :])
    ok = all(list(pre) + p + list(post) == f for p, f in zip(plain, full, strict=True))
    return (pre, post) if ok else None


class Pieces:
    """One text cut into segments: cached ids, or text to encode (``missing``, with their keys)."""

    __slots__ = ("ids", "keys", "missing")

    def __init__(self, ids: list[array[int] | None], keys: list[int], missing: list[str]) -> None:
        self.ids, self.keys, self.missing = ids, keys, missing

    def assemble(self, encoded: Sequence[Sequence[int]]) -> tuple[array[int], list[array[int]]]:
        """All the ids, and the encoded segments' ids (in ``missing`` order); thread-safe."""
        fresh = [array("I", e) for e in encoded]
        out, it = array("I"), iter(fresh)
        for ids in self.ids:
            out += ids if ids is not None else next(it)
        return out, fresh


class ParagraphCache(IdsLru[int]):
    """See the module docstring."""

    def __init__(self, max_entries: int = 16384, max_ids: int = 8 << 20) -> None:
        super().__init__(max_entries, max_ids)

    def pieces(self, text: str) -> Pieces:
        """``text`` cut into segments, each with its cached ids or to be encoded."""
        segs = split(text, cuts(text))
        keys = [xxhash.xxh3_128_intdigest(s.encode("utf-8", "surrogatepass")) for s in segs]
        ids = [self.get(key) for key in keys]
        missing = [seg for seg, got in zip(segs, ids, strict=True) if got is None]
        self.stats.hits += len(segs) - len(missing)
        self.stats.misses += len(missing)
        return Pieces(ids, keys, missing)

    def store(self, pieces: Pieces, fresh: Sequence[array[int]]) -> None:
        """Keeps the ids of the segments that were encoded."""
        it = iter(fresh)
        for key, ids in zip(pieces.keys, pieces.ids, strict=True):
            if ids is None:
                self.put(key, next(it))
