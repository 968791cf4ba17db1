"""Exact mode's tokenizer: a request's prompt as the engine's token ids (``--tokenizer-path``).

Here: ``tokenizer`` (``PromptTokenizer``), ``chat_template`` (the model's jinja2 template as SGLang
renders it), ``prefix_cache`` and ``paragraph_cache`` (bounded caches of token ids that keep encoding cheap).

May import: ``types``.
"""
