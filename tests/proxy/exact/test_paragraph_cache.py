"""proxy/exact/paragraph_cache.py: long turns encoded a paragraph at a time give exactly the engine's ids (the
real BPE tokenizer of emulator/model_bpe), reuse a document's paragraphs across questions, and are off
for a tokenizer whose ids change where the text is cut."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from proxy.exact.paragraph_cache import SEGMENT_CHARS, ParagraphCache, cuts, cuts_are_exact, special_wrap
from proxy.exact.prefix_cache import PrefixCache
from proxy.exact.tokenizer import PromptTokenizer

DIR = Path(__file__).resolve().parents[3] / "emulator" / "model_bpe"
RAW = Tokenizer.from_file(str(DIR / "tokenizer.json"))
BASE = PromptTokenizer.load(str(DIR))
WORDS = st.sampled_from(
    ["the", "Cache", " route", " ", "\n", "\n\n", "é", "日本", "fox.", "42", "\tx", "'s", "-"]
)
LINES = st.lists(st.lists(WORDS, min_size=1, max_size=12).map("".join), min_size=1, max_size=400).map(
    "\n".join
)


def encode(text: str) -> list[int]:
    ids: list[int] = RAW.encode(text, add_special_tokens=False).ids
    return ids


def chat(tok: PromptTokenizer, content: str, question: str = "") -> str:
    body = {
        "messages": [
            {"role": "system", "content": "Answer."},
            {"role": "user", "content": content + question},
        ]
    }
    return tok.chat_text(body)


def test_cut_points_follow_a_newline_and_hold_a_letter() -> None:
    text = ("a" * 10 + "\n1\n b\nWord") * 3
    got = cuts(text, 8)
    assert got and all(text[c - 1] == "\n" and text[c].isalpha() for c in got)
    assert cuts("x" * 100, 8) == []  # no newline: one segment


@settings(max_examples=40, deadline=None)
@given(LINES, LINES)
def test_paragraph_encoding_gives_exactly_the_cold_ids(doc: str, question: str) -> None:
    tok = BASE.with_cache(PrefixCache())
    assert tok.paragraphs is not None  # model_bpe is a byte-level BPE: its cuts are exact
    for q in (question, "\n" + question, question[::-1]):  # the second and third reuse the document
        text = chat(tok, doc, q)
        assert list(tok.chat_ids(text)) == encode(text)


def test_a_document_before_new_questions_is_encoded_once() -> None:
    tok = BASE.with_cache(PrefixCache())
    assert tok.paragraphs is not None
    doc = "\n".join(
        f"Paragraph {i} of the contract says the party shall pay {i} dollars." for i in range(400)
    )
    misses = []
    for n in range(3):
        text = chat(tok, doc, f"\nQuestion {n}: what is owed?")
        assert list(tok.chat_ids(text)) == encode(text)
        misses.append(tok.paragraphs.stats.misses)
    assert len(doc) > 10 * SEGMENT_CHARS and misses[0] > 10
    assert [misses[1] - misses[0], misses[2] - misses[1]] == [1, 1]  # only the question's segment is new


async def test_the_threaded_path_gives_the_same_ids() -> None:
    tok = BASE.with_cache(PrefixCache())
    doc = "\n".join(f"Line {i}: the route of the cache" for i in range(2000))
    for question in ("\nFirst?", "\nSecond?"):
        text = chat(tok, doc, question)
        ids, threaded = await tok.ids_async(text, chat=True)
        assert list(ids) == encode(text)
    assert threaded is False  # the second one had only its question left to encode: inline


def test_a_tokenizer_that_adds_a_prefix_space_per_piece_is_not_cut() -> None:
    vocab = {
        c: i
        for i, c in enumerate(
            sorted({*"▁abcdefghijklmnopqrstuvwxyzÉéàü日本語のテキスト\n\t'-:.,=()123456ZAHNxyo "})
        )
    }
    sp = Tokenizer(models.BPE(vocab, [], unk_token=None))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    sp.decoder = decoders.Metaspace()

    def many(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in sp.encode_batch(texts, add_special_tokens=False)]

    assert not cuts_are_exact(many)
    assert cuts_are_exact(lambda texts: [e.ids for e in RAW.encode_batch(texts, add_special_tokens=False)])


def test_the_cache_bounds_its_ids() -> None:
    cache = ParagraphCache(max_entries=3, max_ids=10_000)
    for n in range(6):
        text = "\n".join(f"Alpha {n} {i}" * 40 for i in range(20))
        pieces = cache.pieces(text)
        _, fresh = pieces.assemble([[1] * 50 for _ in pieces.missing])
        cache.store(pieces, fresh)
    assert len(cache) <= 3 and cache.total_ids <= 150


def with_bos_eos() -> tuple[PromptTokenizer, Tokenizer]:
    """model_bpe with a post-processor that puts ``<|im_start|>`` before a text and ``<|endoftext|>``
    after it (a BOS and an EOS, as Llama-style tokenizers add to a text prompt)."""
    raw = Tokenizer.from_file(str(DIR / "tokenizer.json"))
    raw.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A <|endoftext|>",
        special_tokens=[("<|im_start|>", 151644), ("<|endoftext|>", 151643)],
    )
    return PromptTokenizer(raw, None, PrefixCache()), raw


async def test_a_text_prompt_reuses_its_documents_paragraphs_with_the_specials_its_encode_adds() -> None:
    doc = "\n".join(f"Clause {i}: the tenant shall pay {i} dollars on the first day." for i in range(400))
    for tok, raw in ((BASE.with_cache(PrefixCache()), RAW), with_bos_eos()):
        assert tok.paragraphs is not None
        misses = []
        for n, threaded_expected in ((0, True), (1, False)):
            text = doc + f"\nQuestion {n}: what is owed?"
            ids, threaded = await tok.ids_async(text, chat=False)
            assert list(ids) == raw.encode(text).ids and threaded is threaded_expected
            assert tok.text_ids(text) == ids
            misses.append(tok.paragraphs.stats.misses)
        assert misses[1] - misses[0] == 1  # the second prompt encoded only its question's segment
    raw = with_bos_eos()[1]

    def encode_many(texts: list[str], specials: bool = False) -> list[list[int]]:
        return [e.ids for e in raw.encode_batch(texts, add_special_tokens=specials)]

    assert special_wrap(encode_many) == ((151644,), (151643,))


def test_specials_that_are_not_fixed_ids_around_the_text_keep_the_direct_encode() -> None:
    def counted(texts: list[str], specials: bool = False) -> list[list[int]]:
        ids = [[ord(c) for c in t] for t in texts]
        return [[len(t), *i] for t, i in zip(texts, ids, strict=True)] if specials else ids

    def fixed(texts: list[str], specials: bool = False) -> list[list[int]]:
        return [[1, *(ord(c) for c in t), 2] if specials else [ord(c) for c in t] for t in texts]

    assert special_wrap(counted) is None  # the "BOS" is the text's length: not one id for every text
    assert special_wrap(fixed) == ((1,), (2,))
