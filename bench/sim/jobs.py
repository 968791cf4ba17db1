"""Each request of a scenario made ready once for every system: what the gateway and the engine see.

A ``Job`` holds, for one ``SimRequest``:

- ``request``: the ``routing.prompt.PromptRequest`` the gateway routes, from ``proxy.front.openai.
  parse_request`` (pure) over the body's JSON bytes and the session header, as ``proxy/front/handlers.py``
  calls it for a chat or completions body;
- ``work``: the emulator engine's ``Work``: the prompt's token ids as a replica renders and tokenizes
  the body (the emulator's chat template and pseudo-tokenizer, through ``bench.systems.oracle``'s line-cached
  ``SegmentTokenizer``, which gives the same ids; ``bench.workloads.floor`` uses it too), the cache namespace
  (``cache_salt`` + ``extra_key``, ``emulator.openai_request.extra_key_of``) and the output tokens the
  emulator's seeded sampler draws for it (``max_tokens`` of them, exactly as a replica would: all the
  replicas of a fleet share one emulator seed, so the output does not depend on where it runs).

The prompt, the outputs and the routing request do not depend on the system, so they are built once per
scenario and replayed by every system.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from bench.sim.spec import SimRequest
from bench.workloads.tokens import SegmentTokenizer, token_ids
from emulator.openai_request import extra_key_of
from emulator.sampler import Sampler, Sampling
from emulator.tickets import Work
from emulator.tokenizer import PseudoTokenizer
from proxy.front.openai import parse_request
from proxy.types import Route
from routing.prompt import PromptRequest

CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    request: PromptRequest
    work: Work
    max_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.work.prompt)


def make_jobs(requests: tuple[SimRequest, ...], emulator_seed: int) -> tuple[Job, ...]:
    """One Job per request, in index order (module docstring)."""
    tokenizer = SegmentTokenizer()
    sampler = Sampler(PseudoTokenizer(), emulator_seed)
    return tuple(_job(r, tokenizer, sampler) for r in sorted(requests, key=lambda r: r.index))


def _job(req: SimRequest, tokenizer: SegmentTokenizer, sampler: Sampler) -> Job:
    body = dict(req.body)
    route = Route.CHAT if req.path == CHAT else Route.COMPLETIONS
    parsed = parse_request(route, orjson.dumps(body), session=req.session)
    ids = token_ids(tokenizer, req.path, body)
    if ids is None:
        raise ValueError(f"request {req.index}: neither a chat body nor a text completion")
    max_tokens = int(body["max_tokens"])
    output = sampler.sample(ids, Sampling(max_new=max_tokens), 0).ids
    work = Work(f"sim-{req.index}", tuple(ids), extra_key_of(body), (output,))
    return Job(req.index, parsed.routing, work, max_tokens)
