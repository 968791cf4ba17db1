"""Token-id prompts are keyed exactly: ``token_block_hashes`` per ``token_block`` ids."""

from __future__ import annotations

import dataclasses

from routing.canonical import namespace_salt
from routing.config import RoutingConfig
from routing.hashing import token_block_hashes
from routing.prompt import Namespace, PromptRequest, TokenPrompt
from routing.router import Router

CFG = RoutingConfig(token_block=16)


def _req(ids: list[int], ns: Namespace | None = None) -> PromptRequest:
    return PromptRequest("m", TokenPrompt(tuple(ids)), ns or Namespace())


def test_token_prompts_are_keyed_with_token_block_hashes_and_exact_estimates() -> None:
    ids = list(range(7, 7 + 100))
    ns = Namespace(cache_salt="s", tenant="t")
    rreq = Router(CFG).prepare(_req(ids, ns))
    assert rreq.block_hashes == token_block_hashes("m", ids, namespace_salt(ns), 16, CFG.max_blocks)
    assert len(rreq.block_hashes) == 6  # 100 // 16 full blocks, the partial one unhashed
    assert rreq.prompt_tokens == 100 and rreq.block_tokens == 16.0


def test_shared_leading_ids_share_leading_keys_and_namespaces_separate_them() -> None:
    router = Router(CFG)
    system = [5] * 40  # 2.5 blocks in common
    a, b = router.prepare(_req(system + [1] * 30)), router.prepare(_req(system + [2] * 30))
    assert a.block_hashes[:2] == b.block_hashes[:2] and a.block_hashes[2] != b.block_hashes[2]
    req = _req(system + [1] * 30)
    salted = router.prepare(dataclasses.replace(req, namespace=Namespace(cache_salt="x")))
    tenant = router.prepare(dataclasses.replace(req, namespace=Namespace(tenant="acme")))
    assert not {*salted.block_hashes} & {*a.block_hashes}
    assert not {*tenant.block_hashes} & ({*a.block_hashes} | {*salted.block_hashes})


def test_max_blocks_bounds_token_keys() -> None:
    router = Router(dataclasses.replace(CFG, max_blocks=3))
    assert len(router.prepare(_req(list(range(1000)))).block_hashes) == 3
