"""Regenerate this directory's tokenizer: `python -m emulator.model_bpe.make_tokenizer` (repository root).

A real byte-level BPE `tokenizer.json` (HuggingFace `tokenizers`), trained here on seeded synthetic text
(the benchmark's syllable inventory, the sampler's words, digits and punctuation), so that the emulator
(``--emu-tokenizer hf``) and the gateway (``--tokenizer-path``) can both tokenize a prompt the way SGLang
does, from one local file: a byte-level BPE never maps text to an unknown token, so equal token ids mean
equal text. The ChatML special tokens keep Qwen's ids (151643 up); the chat template is the one of
``emulator/model``. Nothing is downloaded. Training is deterministic for a given `tokenizers` version;
the committed files are what the tests and the benchmark use.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from emulator.model.make_tokenizer import CHAT_TEMPLATE, SPECIALS
from emulator.words import WORDS

HERE = Path(__file__).resolve().parent
VOCAB = 4096
_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "st")


def corpus(seed: int = 7, lines: int = 20_000) -> Iterator[str]:
    """Seeded lines of pseudo-words, the sampler's words, numbers and punctuation."""
    rng = random.Random(seed)
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(6, 18)):
            syl = rng.choice((1, 1, 2, 2, 2, 3))
            w = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) for _ in range(syl)) + rng.choice(_CODAS)
            words.append(rng.choice((w, w, w, rng.choice(WORDS), str(rng.randint(0, 9999)))))
        words[0] = words[0].capitalize()
        yield " ".join(words) + rng.choice((".", ".", ",", "?", ":", "!")) + "\n"


def train() -> dict[str, object]:
    """The tokenizer.json document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    doc: dict[str, object] = json.loads(tok.to_str())
    doc["added_tokens"] = [_added(text, i) for text, i in SPECIALS.items()]
    vocab = doc["model"]["vocab"]  # type: ignore[index]
    vocab.update(SPECIALS)  # so that the special tokens keep their ids on load
    return doc


def _added(text: str, ident: int) -> dict[str, object]:
    return {"id": ident, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}  # fmt: skip


def main() -> None:
    (HERE / "tokenizer.json").write_text(json.dumps(train(), ensure_ascii=False, indent=None) + "\n")
    config = json.loads((HERE.parent / "model" / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config.pop("unk_token", None)
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("config.json", "generation_config.json"):
        (HERE / name).write_text((HERE.parent / "model" / name).read_text())


if __name__ == "__main__":
    main()
