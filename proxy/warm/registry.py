"""The warm-up registry: jobs, their documents and where each is placed, this gateway's and others'.

Each document of a job is assigned replicas (``Router.place_warmup``) and goes through states per
replica: ``queued`` → ``warming`` → ``warm`` (or ``failed``); later ``cold`` when the cache model says it
left every tier of that replica (evicted, or the replica restarted), then ``queued`` again while the
job's ttl lasts (a re-warm), and ``expired`` after it. ``DELETE`` forgets a job and stops re-warming.
The worker that moves documents through these states is ``proxy/warm/jobs.py``.

Documents' text stays in this process's memory while their ttl lasts, for re-warming; it is never
logged, put in ``/status`` or sent anywhere but to the replicas.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from proxy.context import Gateway
from proxy.warm.documents import Document, WarmupRequest
from routing.prompt import PromptRequest
from routing.tiers import host_reusable
from routing.types import ReplicaId, RoutingRequest

CANCEL_NOTICE_S = 30.0  # how long a DELETE of another gateway's job is published
NOT_DURABLE = (
    "HiCache cannot keep it here (off, or write_through on a hybrid model): it will not survive GPU pressure"
)


@dataclass(slots=True)
class Placement:
    replica: ReplicaId
    status: str = "queued"
    seconds: float = 0.0
    warmed_at: float = 0.0
    rewarms: int = 0
    error: str | None = None


@dataclass(slots=True)
class WarmDoc:
    doc: Document
    routing: RoutingRequest  # hashes and tokens of the whole document (prepared again once it is warm)
    placements: list[Placement]
    warnings: list[str] = field(default_factory=list)
    reported_tokens: int | None = None  # what a replica reported for the whole document, once warm

    @property
    def tokens(self) -> int:
        """Exact with the gateway's tokenizer (``--tokenizer-path``: the ids the replica keys its cache by);
        else the replica's own count once one reported it; before that, the estimate from the bytes per
        token the router has learned."""
        if self.routing.exact_keys:
            return self.routing.prompt_tokens
        return self.reported_tokens or self.routing.prompt_tokens


def _live(d: WarmDoc) -> bool:
    return any(p.status != "expired" for p in d.placements)


@dataclass(slots=True)
class Job:
    id: str
    created_s: float
    expires_s: float
    replicas: int | None
    docs: list[WarmDoc]
    owner: str = ""  # who may see it (``proxy/warm/access.py``): a tenant's or a key's bucket, "" admin
    tenant: str = ""  # the namespace its documents are warmed in
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def settled(self) -> bool:
        return all(p.status not in ("queued", "warming") for d in self.docs for p in d.placements)


class WarmRegistry:
    """The jobs of one gateway and the views of other gateways' jobs (the base of ``WarmJobs``)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.jobs: dict[str, Job] = {}
        self._wake = asyncio.Event()
        self.peers: dict[str, list[dict[str, Any]]] = {}  # other gateways' jobs (their views)
        self.cancelled: dict[str, float] = {}  # others' jobs deleted here -> until when to say so

    # ---- the registry -------------------------------------------------------------------------------
    def submit(self, req: WarmupRequest, owner: str = "", tenant: str = "") -> Job:
        now = time.monotonic()
        job = Job("wu_" + uuid.uuid4().hex[:16], now, now + req.ttl_s, req.replicas, [], owner, tenant)
        warmed = self.warmed_tokens()
        for doc in req.documents:
            placed = self._place(doc, req.replicas, warmed)
            for p in placed.placements:
                warmed[p.replica] = warmed.get(p.replica, 0.0) + placed.tokens
            job.docs.append(placed)
        self.jobs[job.id] = job
        self._wake.set()
        return job

    def forget(self, job_id: str) -> bool:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            job.done.set()
        return job is not None

    def warmed_tokens(self) -> dict[ReplicaId, float]:
        """Per replica, the tokens of live warmed (or warming) documents assigned there, by this
        gateway or another."""
        out: dict[ReplicaId, float] = {}
        for job in self.jobs.values():
            for d in job.docs:
                for p in d.placements:
                    if p.status != "expired":
                        out[p.replica] = out.get(p.replica, 0.0) + d.tokens
        for view in self.peer_jobs().values():
            for doc in view["documents"]:
                for p in doc["replicas"]:
                    if p["status"] != "expired":
                        out[p["replica"]] = out.get(p["replica"], 0.0) + float(doc["tokens"])
        return out

    def owned_tokens(self, owner: str) -> int:
        """Tokens of the documents ``owner``'s live jobs hold warm (or warming), here and elsewhere."""
        mine = sum(d.tokens for j in self.jobs.values() if j.owner == owner for d in j.docs if _live(d))
        views = (v for v in self.peer_jobs().values() if v.get("owner") == owner)
        theirs = sum(int(d["tokens"]) for v in views for d in v["documents"] if d["status"] != "expired")
        return mine + theirs

    # ---- other gateways' jobs (proxy/sync/state_sync.py) -------------------------------------------------
    def peer_jobs(self) -> dict[str, dict[str, Any]]:
        """Job id -> the view its gateway last published (with a ``gateway`` field)."""
        return {v["id"]: v | {"gateway": g} for g, views in self.peers.items() for v in views}

    def cancel_elsewhere(self, job_id: str) -> bool:
        """Deletes another gateway's job: said in this gateway's published documents for a while."""
        if job_id not in self.peer_jobs():
            return False
        self.cancelled[job_id] = time.monotonic() + CANCEL_NOTICE_S
        for g, views in self.peers.items():
            self.peers[g] = [v for v in views if v["id"] != job_id]
        return True

    def adopt(self, docs: dict[str, Any]) -> None:
        """The other gateways' registries: their jobs, and ours they deleted."""
        now = time.monotonic()
        self.cancelled = {j: t for j, t in self.cancelled.items() if t > now}
        self.peers = {g: [v for v in d["jobs"] if v["id"] not in self.cancelled] for g, d in docs.items()}
        for d in docs.values():
            for job_id in d["cancel"]:
                self.forget(job_id)

    def _place(self, doc: Document, count: int | None, warmed: dict[ReplicaId, float]) -> WarmDoc:
        router, fleet = self.gw.router, self.gw.fleet
        states = fleet.snapshot(doc.model)
        request = self.prompt(doc)
        order = router.place_warmup(request, states, warmed)
        chosen = order if count is None else order[:count]
        wd = WarmDoc(doc, router.prepare(request), [Placement(r) for r in chosen])
        by_id = {s.id: s for s in states}
        if any(not host_reusable(by_id[r]) for r in chosen):
            wd.warnings.append(NOT_DURABLE)
        if count is not None and len(chosen) < count:
            wd.warnings.append(f"asked for {count} replicas, {len(chosen)} can serve '{doc.model}'")
        if not chosen:
            wd.warnings.append(f"no healthy replica serves '{doc.model}'")
        return wd

    def prompt(self, doc: Document) -> PromptRequest:
        """What routing sees of the whole document: its engine token ids with the gateway's tokenizer,
        else its text (whose tokens the router estimates)."""
        whole = doc.whole().parsed
        return (self.gw.tokenizer.tokenized_now(whole) if self.gw.tokenizer else whole).routing

    def counted(self, d: WarmDoc, reported: int | None) -> None:
        """The document is warm and a replica reported its prompt tokens: that count is kept, and its
        routing view prepared again with what the router has learned of tokens meanwhile."""
        if reported:
            d.reported_tokens = reported
            d.routing = self.gw.router.prepare(self.prompt(d.doc))

    def where(self, d: WarmDoc) -> dict[ReplicaId, dict[str, float | str]]:
        """Per replica, where the document sits now per the cache model: tokens per tier, and the tier
        most of it is in (``gpu``, ``host``, ``storage`` or ``cold``)."""
        states = self.gw.fleet.snapshot(d.doc.model)
        out: dict[ReplicaId, dict[str, float | str]] = {}
        for rid, m in self.gw.router.where(d.routing, states).items():
            tiers = {"gpu": m.gpu_tokens, "host": m.host_tokens, "storage": m.storage_tokens}
            top = max(tiers, key=lambda t: tiers[t])
            out[rid] = {**tiers, "tokens": m.total_tokens, "tier": top if m.total_tokens else "cold"}
        return out
