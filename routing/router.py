"""The front door of routing: one ``Router`` owns the policy, the cache model and every learner.

The proxy drives one request through it in three calls, and never reaches past it:

    ticket = router.route(prompt_request, fleet.snapshot(model))  # render, hash, estimate, sync, match,
                                                                    # decide, record
    ticket = router.retarget(ticket, next_replica)   # a retry: the first record is rolled back, the
                                                     # request re-predicted and recorded for the new one
    router.finish(ticket, report)                    # what the replica reported: learn, confirm or roll back

``route`` renders the typed prompt canonically (``routing.canonical``), hashes it into chained blocks
(``routing.hashing``; a token-id prompt, from a body's ids or the gateway's tokenizer, is hashed per
``token_block`` ids instead: the exact keys KV events map to), estimates its tokens (``routing.tokens``,
the one estimator), syncs the cache model with the snapshot once, matches every replica, lets the policy
(``routing.pipeline``) decide, tells the policy's stages where the request went, and records it in the
cache model. The ``Ticket``
carries everything the outcome needs: the routing request, the decision, a typed ``Prediction`` (the
match and the TTFT terms on the replica that will serve it) and the cache model's receipt; a retried
request's outcome is therefore learned against the replica that served it.

``preview`` decides as ``route`` would and records nothing (the admin API's route preview, which also
lets several gateways' views be compared request by request).

``finish`` settles the receipt (a request that never ran is rolled back), teaches the token estimator
(text prompts; the cache model's capacities are re-converted to blocks when the estimate moves by more
than ``RESIZE_FRACTION``) and the rate learner. Tickets are tracked in a bounded ledger
(``routing.ledger.OpenTickets``): finishing or retargeting a ticket twice is harmless, and tickets that are
never finished are settled as if they ran once ``MAX_OPEN`` newer ones are open.

Exact mode (``routing.exact``): ``apply_kv_events`` takes a replica's KV-event batches (the proxy's
subscriber decodes them), ``kv_reset`` what a lost stream means, ``kv_mode`` the replica's mode. Token-id
prompts are keyed with ``token_block_hashes`` over ``token_block`` ids per key (``exact_keys``), the
keys the events are mapped to.

Pure and synchronous: no I/O, no clock, no environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import xxhash

from routing.cache_model import CacheModel
from routing.calibration import AccuracyStats
from routing.canonical import namespace_salt, render
from routing.config import RoutingConfig
from routing.exact import KvMode
from routing.hashing import block_hashes, token_block_hashes
from routing.kv_events import EventBatch
from routing.ledger import OpenTickets, Preview, Ticket
from routing.pipeline import Choice
from routing.policies.factory import build_policy
from routing.prompt import PromptRequest, TokenPrompt
from routing.rates import RateBook
from routing.sharing import Discarded, Event, Outbox, Restarted, Routed, apply_events
from routing.status import RouterStatus, router_status
from routing.tokens import TokenEstimator
from routing.ttft import predict_ttft
from routing.types import (
    NO_MATCH,
    BlockHash,
    Candidate,
    Decision,
    Prediction,
    PrefixMatch,
    Reason,
    ReplicaId,
    ReplicaState,
    Report,
    RoutingRequest,
    TtftTerms,
)
from routing.warm_placement import rank_for_warmup

MAX_OPEN = 8192  # tickets open at once; the oldest beyond are settled as if they ran
RESIZE_FRACTION = 0.1  # the cache model is re-sized when the token estimate moves by more than this


class Router:
    """See the module docstring."""

    def __init__(self, cfg: RoutingConfig) -> None:
        self.cfg = cfg
        self.tokens = TokenEstimator(cfg.chars_per_token, cfg.block_chars)
        self.rates = RateBook(cfg)
        self.cache = CacheModel(cfg, self.tokens.block_tokens())
        self.policy = build_policy(cfg, self.rates)
        self._open: OpenTickets[Ticket] = OpenTickets(MAX_OPEN)
        self._serial = 0
        self.outbox = Outbox()  # what to share with other gateways, once a state store is configured

    @property
    def name(self) -> str:
        return self.policy.name

    def route(self, req: PromptRequest, states: Sequence[ReplicaState]) -> Ticket:
        """Decides and records; raises ``routing.pipeline.NoCandidates`` when no replica can serve."""
        rreq, size = self._prepare(req)
        cands, choice = self._decide(rreq, states)
        prompted = req.prompt is not None
        return self._open_ticket(rreq, choice.decision, cands, size, prompted, choice.chosen.terms)

    def preview(self, req: PromptRequest, states: Sequence[ReplicaState]) -> Preview:
        """What ``route`` would decide now, recording nothing (the admin route preview; comparing
        gateways' views). Raises ``NoCandidates`` as ``route`` does."""
        rreq, _ = self._prepare(req)
        cands, choice = self._decide(rreq, states)
        match = next(c.match for c in cands if c.state.id == choice.decision.replica)
        return Preview(choice.decision, match, choice.chosen.terms, rreq.prompt_tokens)

    def _decide(
        self, rreq: RoutingRequest, states: Sequence[ReplicaState]
    ) -> tuple[tuple[Candidate, ...], Choice]:
        self.cache.sync(states)
        found = self.cache.match(rreq, states).get
        cands = tuple([Candidate(s, found(s.id, NO_MATCH)) for s in states])
        return cands, self.policy.decide(rreq, cands)

    def place_warmup(
        self, req: PromptRequest, states: Sequence[ReplicaState], warmed: Mapping[ReplicaId, float]
    ) -> list[ReplicaId]:
        """Replicas in the order a warm-up should use them (``routing.warm_placement``)."""
        rreq, _ = self._prepare(req)
        self.cache.sync(states)
        matches = self.cache.match(rreq, states)
        return rank_for_warmup(rreq, states, matches, warmed, self.rates, self.cfg.max_utilization)

    def assign(self, req: PromptRequest, states: Sequence[ReplicaState], replica: ReplicaId) -> Ticket:
        """A ticket for ``req`` on the given replica (a warm-up step): predicted and recorded there."""
        rreq, size = self._prepare(req)
        self.cache.sync(states)
        matches = self.cache.match(rreq, states)
        cands = tuple(Candidate(s, matches.get(s.id, NO_MATCH)) for s in states)
        decision = Decision(replica, Reason.WARMUP, 0.0, (replica,))
        return self._open_ticket(rreq, decision, cands, size, req.prompt is not None)

    def prepare(self, req: PromptRequest) -> RoutingRequest:
        """What routing sees of ``req`` (its block hashes and token estimate), for repeated queries."""
        return self._prepare(req)[0]

    def where(self, rreq: RoutingRequest, states: Sequence[ReplicaState]) -> dict[ReplicaId, PrefixMatch]:
        """Per replica, what the cache model holds of a prepared request's prompt now (records nothing)."""
        self.cache.sync(states)
        return self.cache.match(rreq, states)

    def retarget(self, ticket: Ticket, replica: ReplicaId) -> Ticket:
        """The request moves to ``replica`` (a retry): the old record never ran and is rolled back."""
        if self._open.close(ticket.serial) is not None and ticket.recorded is not None:
            self._discarded(ticket.replica, self.cache.settle(ticket.recorded, Report(ok=False)))
        decision = replace(ticket.decision, replica=replica, reason=Reason.FALLBACK)
        return self._open_ticket(
            ticket.request, decision, ticket.candidates, ticket.canonical_bytes, ticket.prompted
        )

    def finish(self, ticket: Ticket, report: Report) -> None:
        """Learns from what the replica reported; a ticket already finished or retargeted is ignored."""
        if self._open.close(ticket.serial) is None:
            return
        if ticket.recorded is not None:
            self._discarded(ticket.replica, self.cache.settle(ticket.recorded, report))
        if not report.ok or not ticket.prompted:
            return
        if ticket.canonical_bytes:
            self._learn_tokens(ticket.canonical_bytes, report.prompt_tokens)
        self.rates.observe(ticket.request, ticket.prediction, report)

    def forget(self, replica: ReplicaId) -> None:
        """The replica left the fleet: drop everything known of it."""
        self.cache.forget(replica)
        self.rates.forget(replica)
        self.policy.forget(replica)

    def restart(self, replica: ReplicaId) -> None:
        """Its GPU and host tiers are gone (a restart, a cache flush); storage, rates and sessions stay."""
        self.cache.restart(replica)
        self.policy.restart(replica)
        self.outbox.put(Restarted(replica))

    # ---- shared state (routing.sharing) ---------------------------------------------------------------
    def share(self, notify: Callable[[], None] | None = None) -> None:
        """From now on, keep the events other gateways should see (``drain`` hands them out);
        ``notify`` is called after each new one (the sync task publishes without waiting a round)."""
        self.outbox.open(notify)

    def drain(self) -> list[Event]:
        return self.outbox.drain()

    def apply(self, events: Sequence[Event]) -> int:
        """What other gateways saw, applied to this one's model and stages; returns the events used."""
        return apply_events(self.cache, self.policy, events)

    # ---- exact mode (routing.exact) ------------------------------------------------------------------
    def apply_kv_events(self, replica: ReplicaId, batch: EventBatch, model: str) -> bool:
        """One KV-event batch published by ``replica`` (serving ``model``: the namespace of its keys);
        from the first one on the replica is in exact mode. False when the replica is not synced yet."""
        return self.cache.apply_kv_events(replica, batch, model)

    def kv_reset(self, replica: ReplicaId, reason: str) -> None:
        """The event stream of ``replica`` was broken (a gap the replay endpoint could not fill, or a
        sequence that went backwards: the publisher restarted). The model then believes the replica's GPU
        and host hold nothing (storage is kept), forgets the engine pages it had mapped and the requests
        in flight there: exactly right after a restart, an under-estimate after a gap. It recovers from
        the events that follow: new chains map from their root pages; pages whose parent was stored
        before the reset stay unmapped (counted as orphans) until the engine stores them again."""
        self.cache.kv_reset(replica, reason)

    def sync(self, states: Sequence[ReplicaState]) -> None:
        """Makes the cache model know these replicas (and their sizes) before any request is routed."""
        self.cache.sync(states)

    def kv_mode(self, replica: ReplicaId) -> KvMode:
        """``exact`` or ``learned`` (and why) for ``replica``, with its event counters."""
        return self.cache.kv_mode(replica)

    def _discarded(self, replica: ReplicaId, blocks: list[BlockHash]) -> None:
        if blocks:
            self.outbox.put(Discarded(replica, tuple(blocks)))

    def accuracy(self) -> Mapping[ReplicaId, AccuracyStats]:
        return self.cache.accuracy()

    def status(self) -> RouterStatus:
        return router_status(self.name, self.cache, self.rates, self.tokens.bytes_per_token, len(self._open))

    # ---- internals ----------------------------------------------------------------------------------
    def _prepare(self, req: PromptRequest) -> tuple[RoutingRequest, int]:
        """The routing request of a typed prompt, and the canonical bytes to learn tokens from."""
        cfg, salt = self.cfg, namespace_salt(req.namespace)
        hashes: tuple[BlockHash, ...]
        exact = isinstance(req.prompt, TokenPrompt)
        if req.prompt is None:
            est, hashes, learn = self.tokens.text(req.size_bytes), (), 0
        elif isinstance(req.prompt, TokenPrompt):  # exact: keyed per token_block ids, as KV events are
            ids = req.prompt.ids
            hashes = token_block_hashes(req.model, ids, salt, cfg.token_block, cfg.max_blocks)
            est, learn = self.tokens.ids(len(ids), cfg.token_block), 0
        else:
            data = render(req.prompt).encode()
            hashes = block_hashes(req.model, data, salt, cfg.block_chars, cfg.max_blocks)
            est, learn = self.tokens.text(len(data)), len(data)
        session = xxhash.xxh3_64_hexdigest(req.session.encode()) if req.session else None
        rreq = RoutingRequest(
            req.model, hashes, est.prompt_tokens, est.block_tokens, session, salt, req.max_new_tokens, exact
        )
        return rreq, learn

    def _open_ticket(
        self,
        rreq: RoutingRequest,
        decision: Decision,
        cands: tuple[Candidate, ...],
        size: int,
        prompted: bool,
        terms: TtftTerms | None = None,
    ) -> Ticket:
        replica = decision.replica
        cand = next((c for c in cands if c.state.id == replica), None) or Candidate(ReplicaState(replica))
        terms = terms or predict_ttft(rreq, cand, self.rates.get(replica), self.cfg.default_new_tokens)
        self.policy.chose(rreq, replica)
        recorded = self.cache.record(rreq, replica, terms.prefill_s)
        if self.outbox.is_open:
            r = rreq
            self.outbox.put(Routed(replica, r.block_hashes, r.block_tokens, r.prompt_tokens, r.session_key))
        self._serial += 1
        prediction = Prediction(replica, cand.match, terms)
        ticket = Ticket(self._serial, rreq, decision, prediction, cands, size, recorded, prompted)
        for stale in self._open.add(ticket.serial, ticket):
            if stale.recorded is not None:
                self.cache.settle(stale.recorded, Report(ok=True))
        return ticket

    def adopt_calibration(self, peers: Sequence[tuple[float, int]]) -> None:
        """Other gateways' token estimates (``TokenEstimator.adopt``); the cache model re-sized when the
        estimate moved far enough."""
        if self.tokens.adopt(peers):
            self._resize_if_moved()

    def _learn_tokens(self, size: int, reported: int | None) -> None:
        self.tokens.observe(size, reported)
        self._resize_if_moved()

    def _resize_if_moved(self) -> None:
        block_tokens = self.tokens.block_tokens()
        sized = self.cache.block_tokens
        if abs(block_tokens - sized) > RESIZE_FRACTION * sized:
            self.cache.resize(block_tokens)
