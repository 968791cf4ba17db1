"""The runs of a PD server's requests: a prefill's sends its KV before it answers, a decode's waits for it.

`PdRole.open_runs(stack, request, jobs, choices, boots)` opens one run per Job into `stack` (leaving the
stack early aborts them, and fails their rooms for the peer):

- prefill: each room is claimed (pd_rooms.py) and the Job held in the bootstrap queue until its decode
  has registered; then it goes to the engine (radix cache, HiCache tiers, chunked prefill: its own
  cached_tokens) with a 1-token output, as SGLang forces max_new_tokens=1. `PrefillRun` holds that token
  back while the KV transfer is modelled (prompt tokens x KV bytes per token / --emu-kv-transfer-gb-s)
  and handed to the decode: the prefill's answer ends at or after the transfer, never before.
- decode: the Job goes to the engine at once and waits there for KV memory (the prealloc queue); once
  admitted, `DecodeRun` resolves the prefill and waits for the room's KV (pd_link.py); the engine then
  sends the prefill's token at once and decodes the rest. Its cached_tokens are the prefill's (§2.5).

A request without a room is refused (400, SGLang's message) unless it takes the fake transfer
(`bootstrap_host` 2.2.2.2, or a decode on the `fake` backend): no peer, nothing cached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from emulator.pd_link import DecodeLink
from emulator.pd_request import Bootstrap, PdError, missing_room
from emulator.pd_rooms import Claim, PrefillRooms
from emulator.replica import ARRIVAL, Job, Replica, Run
from emulator.sampler import Completion
from emulator.tickets import Emitted, Event, Failed, Prefilled, Ticket, Work


@dataclass(eq=False, slots=True)
class PrefillRun(Run):
    """A prefill's run: its first (only) token waits until the room's KV reached the decode."""

    claim: Claim | None = None  # None: the fake transfer (no decode)
    rooms: PrefillRooms | None = None
    sent: bool = False

    async def events(self) -> AsyncGenerator[Event, None]:
        async with contextlib.aclosing(Run.events(self)) as inner:
            async for event in inner:
                if isinstance(event, Emitted) and not self.sent:
                    self.sent = True
                    failure = await self._send()
                    if failure is not None:
                        self.failure = failure
                        yield failure
                        return
                yield event

    async def _send(self) -> Failed | None:
        if self.claim is None or self.rooms is None:
            return None
        cfg, pre = self.replica.cfg, self.prefilled
        tokens = len(self.ticket.work.prompt)
        seconds = cfg.pd.transfer_seconds(tokens, cfg.emu_kv_bytes_per_token)
        result: dict[str, Any] = {"prompt_tokens": tokens, "cached_tokens": self.cached_tokens}
        if pre is not None:
            result |= {"device": pre.device, "host": pre.host, "storage": pre.storage}
        try:
            await self.rooms.send(self.claim, result, seconds, tokens * cfg.emu_kv_bytes_per_token)
        except PdError as err:
            return Failed(err.message, err.status)
        return None


@dataclass(eq=False, slots=True)
class DecodeRun(Run):
    """A decode's run: once admitted it waits for the room's KV, then reports the prefill's cache hits."""

    boot: Bootstrap | None = None
    link: DecodeLink | None = None  # None: the fake transfer (KV at once, nothing cached)
    linked: bool = False

    async def events(self) -> AsyncGenerator[Event, None]:
        async with contextlib.aclosing(Run.events(self)) as inner:
            async for event in inner:
                if isinstance(event, Prefilled) and not self.linked:
                    self.linked = True
                    event = await self._receive(event)
                yield event

    async def _receive(self, own: Prefilled) -> Prefilled:
        outcome: dict[str, Any] = {}
        if self.link is not None and self.boot is not None:
            try:
                outcome = await self.link.receive(self.boot, self.ticket.work.rid)
            except PdError as err:
                self.replica.engine.abort(self.ticket, err.message)  # its Failed event comes next
                return own
        cached, device, host, storage = (
            int(outcome.get(k) or 0) for k in ("cached_tokens", "device", "host", "storage")
        )
        got = Prefilled(cached, device, host, storage, own.queue_s, own.arrival_cached)
        self.prefilled = got
        arrival = self.ticket.kv_arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)
        return got


class PdRole:
    """A PD replica's runtime: its rooms (prefill) or its link to prefills (decode, set once serving)."""

    def __init__(self, replica: Replica, rooms: PrefillRooms | None) -> None:
        self.replica = replica
        self.cfg = replica.cfg.pd
        self.rooms = rooms
        self.link: DecodeLink | None = None

    @property
    def prefill(self) -> bool:
        return self.cfg.mode == "prefill"

    def _fake(self, boot: Bootstrap) -> bool:
        return boot.fake or self.cfg.fake_transfer

    async def open_runs(
        self,
        stack: contextlib.AsyncExitStack,
        request: web.Request,
        jobs: Sequence[Job],
        choices: Sequence[tuple[Completion, ...]],
        boots: Sequence[Bootstrap],
    ) -> list[Run]:
        """One entered run per Job (PdError when SGLang would abort the request before it runs)."""
        for job, boot in zip(jobs, boots, strict=True):
            if boot.room is None and not self._fake(boot):
                raise missing_room(job.rid)
        claims = [self._claim(stack, job, boot) for job, boot in zip(jobs, boots, strict=True)]
        for claim in claims:
            if claim is not None and self.rooms is not None:
                await self.rooms.wait_for_decode(claim)
        runs: list[Run] = []
        for job, comps, boot, claim in zip(jobs, choices, boots, claims, strict=True):
            ticket = self._submit(request, job, comps)
            run: Run
            if self.prefill:
                run = PrefillRun(self.replica, ticket, claim=claim, rooms=self.rooms)
            else:
                ticket.kv_arrival = asyncio.get_running_loop().create_future()
                run = DecodeRun(self.replica, ticket, boot=boot, link=None if self._fake(boot) else self.link)
            runs.append(await stack.enter_async_context(run))
        return runs

    def _claim(self, stack: contextlib.AsyncExitStack, job: Job, boot: Bootstrap) -> Claim | None:
        if not self.prefill or self.rooms is None or self._fake(boot) or boot.room is None:
            return None
        claim: Claim = stack.enter_context(self.rooms.claim(boot.room, job.rid, len(job.prompt)))
        return claim

    def _submit(self, request: web.Request, job: Job, comps: tuple[Completion, ...]) -> Ticket:
        """As Replica.open: the modelled timeline starts when the request arrived."""
        work = Work(job.rid, job.prompt, job.extra_key, tuple(c.ids for c in comps))
        return self.replica.engine.submit(work, request.get(ARRIVAL))


PD_ROLE = web.AppKey("pd_role", PdRole)
