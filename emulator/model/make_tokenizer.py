"""Regenerate this directory's tokenizer files: `python -m emulator.model.make_tokenizer` (repository root).

sglang-router loads the tokenizer named by a worker's model_path from a LOCAL directory (a name that is not
a directory makes it download from a hub, which must never happen here). This writes a tiny valid
HuggingFace `tokenizers` file by hand: a WordLevel model over a few hundred words with a whitespace
pre-tokenizer, the ChatML special tokens (ids as Qwen's), a ChatML chat_template, and a Qwen3-like
config.json. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from emulator.words import WORDS

HERE = Path(__file__).resolve().parent
SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
}
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n"
    "{%- endif %}# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message.role == 'system') %}"
    "{{- '<|im_start|>' + message.role + '\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- endif %}"
    "{{- '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
_WORDS = [
    "the",
    "a",
    "an",
    "and",
    "or",
    "but",
    "if",
    "then",
    "else",
    "of",
    "to",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "from",
    "as",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "it",
    "this",
    "that",
    "these",
    "those",
    "he",
    "she",
    "they",
    "we",
    "you",
    "i",
    "me",
    "my",
    "your",
    "our",
    "their",
    "his",
    "her",
    "its",
    "not",
    "no",
    "yes",
    "do",
    "does",
    "did",
    "done",
    "can",
    "could",
    "will",
    "would",
    "should",
    "may",
    "might",
    "must",
    "have",
    "has",
    "had",
    "get",
    "got",
    "make",
    "made",
    "go",
    "went",
    "come",
    "came",
    "see",
    "saw",
    "know",
    "knew",
    "think",
    "thought",
    "say",
    "said",
    "tell",
    "told",
    "ask",
    "asked",
    "use",
    "used",
    "find",
    "found",
    "give",
    "gave",
    "take",
    "took",
    "work",
    *WORDS,  # the sampler's output vocabulary (emulator/words.py)
    "ok",
    "system",
    "assistant",
    "tool",
    "tools",
    "function",
    "call",
    "calls",
    "name",
    "arguments",
    "value",
    "result",
    "query",
    "answer",
    "question",
    "hello",
    "hi",
    "world",
    "test",
    "prompt",
    "token",
    "tokens",
    "model",
    "request",
    "response",
    "stream",
    "router",
    "replica",
    "server",
    "client",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "first",
    "second",
    "last",
    "new",
    "old",
    "good",
    "bad",
    "big",
    "small",
    "long",
    "short",
    "high",
    "low",
    "more",
    "less",
    "most",
    "least",
    "all",
    "any",
    "some",
    "many",
    "much",
    "few",
    "each",
    "every",
    "other",
    "same",
    "different",
    "what",
    "which",
    "who",
    "whom",
    "whose",
    "when",
    "where",
    "why",
    "how",
    "there",
    "here",
    "now",
    "today",
    "yesterday",
    "tomorrow",
    "please",
    "thanks",
    "write",
    "read",
    "summarize",
    "explain",
    "translate",
    "list",
    "show",
    "help",
    "about",
    "into",
    "over",
    "under",
    "after",
    "before",
    "between",
    "document",
    "section",
    "chapter",
    "paragraph",
    "story",
    "code",
    "python",
    "json",
    "list",
    "dict",
    "number",
    "string",
    "error",
]


def tokenizer_json() -> dict[str, object]:
    vocab = {"[UNK]": 0}
    for word in dict.fromkeys(_WORDS):
        vocab[word] = len(vocab)
    for ch in ".,:;!?'\"()[]{}-_/\\#*+=<>|@$%&~`^0123456789":
        vocab.setdefault(ch, len(vocab))
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in SPECIALS.items()
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def tokenizer_config() -> dict[str, object]:
    decoder = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s, i in SPECIALS.items()
    }
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "model_max_length": 262144,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def config() -> dict[str, object]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 262144,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
        "_comment": "kvroute emulator: a tokenizer-only stand-in; there are no weights.",
    }


def main() -> None:
    for name, data in (
        ("tokenizer.json", tokenizer_json()),
        ("tokenizer_config.json", tokenizer_config()),
        ("config.json", config()),
    ):
        (HERE / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (HERE / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [151645, 151643], "bos_token_id": 151643}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
