"""Which served model a request's ``model`` means: the gateway's model-name policy.

SGLang itself does not check the ``model`` field (contract §1.3: it is echoed back), so a lone replica
accepts ``default``, ``gpt-4o`` or anything else; agent frameworks send such names by default. A fleet
may serve several models, so kvroute resolves, in order:

1. the name of a model some replica serves (``base:adapter`` counts as ``base``: a LoRA adapter);
2. an alias from the config (``--model-alias gpt-4o=qwen3-8b``, ``[model_alias]`` in TOML);
3. with ``single_model_fallback`` (the default) and exactly one model served, that model, as SGLang
   would serve it;
4. otherwise no model: 404 ``model_not_found``.

The request body is forwarded untouched (the replica echoes the name the client sent); the resolved name
decides which replicas may serve it and the namespace of its cache blocks, so ``default`` and the real
name share cached prefixes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def resolve(
    name: str, served: Collection[str], aliases: Mapping[str, str], single_fallback: bool
) -> str | None:
    if name in served or name.split(":", 1)[0] in served:
        return name
    alias = aliases.get(name)
    if alias is not None and alias in served:
        return alias
    if single_fallback and len(served) == 1:
        return next(iter(served))
    return None
