"""The warm-up API: place long documents before the first question (``proxy.warm.jobs`` does the work).

    POST   /v1/warmup        a job: documents to prefill (``proxy.warm.documents``); 202 with the job at once,
                             or, with ``"wait": true``, 200 once every document is warm or failed; without
                             ``model``, the fleet's only model (400 naming them when it serves several)
    GET    /v1/warmup        every job, summarised (with ``--state``: the other gateways' too)
    GET    /v1/warmup/{id}   one job: per document its tokens, replicas, status, seconds, warnings, and
                             where it sits now per the cache model (tokens per tier, per replica)
    DELETE /v1/warmup/{id}   forget the job: its documents are no longer re-warmed

With ``--state``, a job is warmed and re-warmed by the gateway that received it (only it holds the text)
and any gateway answers for it (``WarmupsPart``, at most ~1 s behind).

Who may call, the tenant documents are warmed for, quotas and which jobs a caller sees:
``proxy/warm/access.py`` (the admin key: any tenant and every job; a client key: its own namespace and
jobs). Answers never contain the documents' text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from proxy.context import GATEWAY, Gateway
from proxy.errors import InvalidRequest, NoReplicaAvailable, NotFound
from proxy.front.handlers import read_body
from proxy.front.openai import parse_json
from proxy.sync.state_sync import STATE_SYNC
from proxy.types import ParsedRequest, Route
from proxy.warm import access as warm_access
from proxy.warm.documents import WarmupRequest, parse_warmup
from proxy.warm.jobs import WarmJobs
from proxy.warm.registry import Job, WarmDoc
from routing.prompt import PromptRequest

WARMUPS: web.AppKey[WarmJobs] = web.AppKey("warmups", WarmJobs)
WAIT_LIMIT_S = 3600.0


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc), content_type="application/json")


def doc_view(jobs: WarmJobs, d: WarmDoc, detail: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": d.doc.id,
        "kind": d.doc.kind,
        "tokens": d.tokens,
        "status": _doc_status(d),
        "replicas": [
            {"replica": p.replica, "status": p.status, "seconds": round(p.seconds, 3), "rewarms": p.rewarms}
            | ({"error": p.error} if p.error else {})
            for p in d.placements
        ],
        "warnings": d.warnings,
    }
    if detail:
        where = jobs.where(d)
        for r in view["replicas"]:
            r["now"] = where.get(r["replica"], {"tier": "cold", "tokens": 0.0})
    return view


def _doc_status(d: WarmDoc) -> str:
    states = {p.status for p in d.placements}
    for s in ("warming", "queued", "failed", "cold"):
        if s in states:
            return s
    return states.pop() if len(states) == 1 else "warm" if states else "unplaced"


def job_view(jobs: WarmJobs, job: Job, detail: bool = False) -> dict[str, Any]:
    now = time.monotonic()
    return {
        "id": job.id,
        "object": "warmup",
        "tenant": job.tenant or None,
        "owner": job.owner,
        "status": "done" if job.settled() else "running",
        "age_s": round(now - job.created_s, 3),
        "ttl_s": round(max(0.0, job.expires_s - now), 3),
        "documents": [doc_view(jobs, d, detail) for d in job.docs],
    }


async def create(request: web.Request) -> web.Response:
    gw, jobs = request.app[GATEWAY], request.app[WARMUPS]
    who = warm_access.caller(request, gw)
    raw = await read_body(request, gw.settings.max_body_bytes)
    body = parse_json(raw)
    if "model" not in body:
        body = {**body, "model": _only_model(gw)}
    tenant = warm_access.tenant_for(who, gw, body)
    req = parse_warmup(body, tenant)
    await warm_access.charge(who, gw, len(raw))
    probe = ParsedRequest(Route.CHAT, req.model, False, None, PromptRequest(req.model, None))
    model = gw.resolve_model(probe).model or req.model
    owner = who.owner_for(tenant)
    held = jobs.owned_tokens(owner)
    job = jobs.submit(_with_model(req, model), owner, tenant)
    try:
        warm_access.check_quota(gw, held, job, owner)
    except warm_access.QuotaExceeded:
        jobs.forget(job.id)
        raise
    if not req.wait:
        return _json(job_view(jobs, job), status=202)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT_LIMIT_S):
            await job.done.wait()
    return _json(job_view(jobs, job, detail=True))


def _only_model(gw: Gateway) -> str:
    """The model of a request that names none: the fleet's only one; 400 naming the choices when it
    serves several, 503 when no replica has answered yet."""
    served = sorted(gw.fleet.models())
    if len(served) == 1:
        return served[0]
    if not served:
        raise NoReplicaAvailable(f"no replica has answered yet; tried: {gw.fleet.answers()}")
    raise InvalidRequest(f"'model' is needed: the fleet serves {', '.join(served)}", param="model")


def _with_model(req: WarmupRequest, model: str) -> WarmupRequest:
    """The request for the served model its ``model`` names (aliases, the single-model fallback)."""
    docs = tuple(dataclasses.replace(d, model=model) for d in req.documents)
    return dataclasses.replace(req, model=model, documents=docs)


async def list_jobs(request: web.Request) -> web.Response:
    """This gateway's jobs, then the other gateways' (as they last published them, ``gateway`` set),
    those the caller may see."""
    who = warm_access.caller(request, request.app[GATEWAY])
    jobs = request.app[WARMUPS]
    views = [job_view(jobs, j) for j in jobs.jobs.values()] + list(jobs.peer_jobs().values())
    return _json({"object": "list", "data": [v for v in views if who.may_see(v["owner"])]})


def _owner(jobs: WarmJobs, job_id: str) -> str | None:
    job = jobs.jobs.get(job_id)
    if job is not None:
        return job.owner
    view = jobs.peer_jobs().get(job_id)
    return None if view is None else str(view.get("owner", ""))


def _visible(request: web.Request) -> tuple[WarmJobs, str]:
    """The job id of the path, when the caller may see it: else the 404 of an unknown one."""
    who = warm_access.caller(request, request.app[GATEWAY])
    jobs, job_id = request.app[WARMUPS], request.match_info["job"]
    owner = _owner(jobs, job_id)
    if owner is None or not who.may_see(owner):
        raise NotFound(f"no warm-up job {job_id!r}", param="id")
    return jobs, job_id


async def get_job(request: web.Request) -> web.Response:
    jobs, job_id = _visible(request)
    job = jobs.jobs.get(job_id)
    return _json(job_view(jobs, job, detail=True) if job is not None else jobs.peer_jobs()[job_id])


async def delete_job(request: web.Request) -> web.Response:
    jobs, job_id = _visible(request)
    if not jobs.forget(job_id):
        jobs.cancel_elsewhere(job_id)
    return _json({"id": job_id, "object": "warmup", "deleted": True})


class WarmupsPart:
    """The warm-up registry as another gateway sees it (``proxy.sync.shared_docs``): this gateway's jobs
    (ids, document ids, tokens, per replica states; never text) and the others' it deleted. Only the
    gateway that holds a job's text warms and re-warms it."""

    kind, every_s, ttl_s = "warmups", 1.0, 30.0

    def __init__(self, jobs: WarmJobs) -> None:
        self.jobs = jobs

    def export(self) -> dict[str, Any]:
        jobs = self.jobs
        return {"jobs": [job_view(jobs, j) for j in jobs.jobs.values()], "cancel": list(jobs.cancelled)}

    def adopt(self, docs: dict[str, Any]) -> None:
        self.jobs.adopt(docs)


async def warmups_ctx(app: web.Application) -> AsyncIterator[None]:
    """The warm-up worker runs as long as the app."""
    task = asyncio.get_running_loop().create_task(app[WARMUPS].run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def warm_section(jobs: WarmJobs) -> dict[str, Any]:
    """The warm-up part of ``/status``: every document of every job (this gateway's and the others')."""
    views = [job_view(jobs, j) for j in jobs.jobs.values()] + list(jobs.peer_jobs().values())
    docs = [
        {"job": v["id"], "tenant": v.get("tenant")}
        | {"document": d["id"], "tokens": d["tokens"], "status": d["status"]}
        | {"replicas": ", ".join(f"{p['replica']} {p['status']}" for p in d["replicas"])}
        for v in views
        for d in v["documents"]
    ]
    return {
        "jobs": len(views),
        "steps": jobs.steps_sent,
        "preempted_steps": jobs.preemptions,
        "tokens_per_replica": jobs.warmed_tokens(),  # live placements: the working set on each replica
        "documents": docs,
    }


def warm_counts(jobs: WarmJobs) -> dict[str, float]:
    """Documents per state (``kvroute_warmup_documents{state}``), this gateway's jobs only."""
    out = dict.fromkeys(("queued", "warming", "warm", "cold", "failed", "expired"), 0.0)
    for job in jobs.jobs.values():
        for d in job.docs:
            for p in d.placements:
                out[p.status] = out.get(p.status, 0.0) + 1
    return out


def add_routes(app: web.Application) -> None:
    app[WARMUPS] = jobs = WarmJobs(app[GATEWAY])
    app[GATEWAY].fleet.live_arrived = jobs.preempt
    metrics = app[GATEWAY].metrics
    metrics.register_section("warmup", lambda: warm_section(jobs))
    metrics.register_source("warmup_documents", lambda: warm_counts(jobs), "Warm-up placements by state")
    if (sync := app.get(STATE_SYNC)) is not None:
        sync.parts.append(WarmupsPart(app[WARMUPS]))
    app.cleanup_ctx.append(warmups_ctx)
    r = app.router
    r.add_post("/v1/warmup", create)
    r.add_get("/v1/warmup", list_jobs)
    r.add_get("/v1/warmup/{job}", get_job)
    r.add_delete("/v1/warmup/{job}", delete_job)
