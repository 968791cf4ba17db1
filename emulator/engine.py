"""One replica's scheduler: FCFS queue, admission into the radix cache, chunked prefill, decode.

The engine is one asyncio task per replica that runs *steps*, like SGLang's scheduler loop:

1. Form a step. First the in-progress chunked request's next chunk; then new requests from the head of
   the FCFS queue while fewer than max_running_requests run and the step's budget lasts. As in SGLang's
   PrefillAdder the budget is shared by the step: min(chunked_prefill_size, max_prefill_tokens) tokens
   with chunked prefill on, so a chunked request mid-prompt fills a step alone and a new request joins
   its last chunk's step (or starts the next chunked request with what that step leaves). Admission
   calls `RadixCache.admit()`, which locks the matched prefix, loads host/storage pages back to GPU and
   reserves GPU room for the uncached prompt and the output; if it refuses, the head waits (strict
   FCFS) until a finished or aborted request frees memory.
2. Sleep the step: sum over its requests of the prefill cost of their chunk [s, e) (positions matter,
   see timing.py) plus the host/storage load time of the newly admitted, times the fault slow factor and
   the time scale.
3. After the step, every request inserts the prompt it has computed so far into the radix cache
   (`insert_unfinished`, SGLang's cache_unfinished_req: chunked=True after an intermediate chunk,
   chunked=False once its prefill is complete), keeping it locked: a request admitted from then on hits
   it on GPU while this one still prefills or decodes.
4. Requests whose prefill is complete get their first token `overhead` later and decode in their own task
   (one token per decode-step latency, which grows with the number of decoding sequences), then
   `finish()` inserts prompt + output into the cache. An abort releases the request with `abort()`
   (what it inserted stays cached).

A PD decode's request (`Ticket.kv_arrival` set, pd_runs.py) is admitted the same way (its KV memory is
reserved) but computes nothing: its prefill costs no time and its first token is sent the moment its
KV arrives from the prefill server, then it decodes as any other.

Modelled time is paced by deadlines, not by relative sleeps: a step starts at the latest of the previous
step's end, the arrival of its new requests (stamped when the HTTP request came in, before parsing) and,
for a request that had to wait for a slot or memory, the moment a running request released them. So the
real time the emulator spends parsing, matching and admitting is hidden inside the modelled durations
instead of being added to them, and wall-clock TTFT = modelled TTFT x time scale (plus loopback I/O).
Decode does not share the prefill engine here (real SGLang interleaves decode steps with prefill
batches); queue predictions count prefill work only.

The output tokens are decided before the request is queued (sampler.py), so the engine only paces
them. Everything a handler needs arrives as events on the ticket's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections import deque
from collections.abc import Callable, Sequence

from emulator.radix import RadixCache
from emulator.tickets import (
    Emitted,
    EngineLimits,
    EngineListener,
    Failed,
    Finished,
    Prediction,
    Prefilled,
    Ticket,
    Work,
)
from emulator.timing import TimingModel, ttft_seconds

__all__ = ["Engine"]


class Engine:
    """The scheduler of one replica; start with `run()` as a task, stop by cancelling it."""

    def __init__(
        self, cache: RadixCache, timing: TimingModel, limits: EngineLimits, listener: EngineListener
    ) -> None:
        self.cache = cache
        self.timing = timing
        self.limits = limits
        self.listener = listener
        self.slow_factor = 1.0
        self.waiting: deque[Ticket] = deque()
        self.prefilling: list[Ticket] = []
        self.decoding: set[Ticket] = set()
        self.decoding_seqs = 0
        self.step_end = 0.0  # loop time when the current step ends
        self._free_at = 0.0  # loop time when the previous step ended (the modelled GPU was free)
        self._released_at = 0.0  # loop time when a request last ended and freed a slot and memory
        self._step_ends: dict[Ticket, int] = {}  # prefill position each request reaches at step end
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.after_prefill: Callable[[], None] | None = None  # publishes KV events (emulator/kv_events.py)

    # ---- public API -------------------------------------------------------------------------
    def submit(self, work: Work, arrival: float | None = None) -> Ticket:
        """Queue a request; `arrival` (loop time, default now) anchors its modelled timeline."""
        when = self._now() if arrival is None else min(arrival, self._now())
        ticket = Ticket(work=work, arrival=when)
        self._match_on_arrival(ticket)
        self.waiting.append(ticket)
        self._wake.set()
        return ticket

    def abort(self, ticket: Ticket, reason: str = "aborted") -> bool:
        """Stop a request wherever it is; True if it was still in flight."""
        if ticket.done:
            return False
        if ticket in self.waiting:
            self.waiting.remove(ticket)
        if ticket in self.prefilling:
            self.prefilling.remove(ticket)
        if ticket.decode_task is not None and ticket.decode_task is not asyncio.current_task():
            ticket.decode_task.cancel()
        self._release(ticket, insert=False)
        ticket.events.put_nowait(Failed(reason, 500))
        return True

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def queued_prefill_tokens(self) -> int:
        waiting = sum(len(t.work.prompt) for t in self.waiting)
        return waiting + sum(len(t.work.prompt) - t.pos for t in self.prefilling)

    def queue_seconds(self) -> float:
        """Modelled seconds until a request arriving now would be admitted (prefill work ahead of it)."""
        step_left = max(0.0, self.step_end - self._now()) / self.limits.time_scale
        ahead = sum(
            self.timing.prefill_seconds(self._step_ends.get(t, t.pos), len(t.work.prompt))
            for t in self.prefilling
        )
        ahead += sum(t.est_prefill_s for t in self.waiting)
        return step_left + ahead * self.slow_factor

    def predict(self, prompt: Sequence[int], extra_key: str | None) -> Prediction:
        """The modelled TTFT a request would get if it arrived now (a pure peek)."""
        key = extra_key if self.limits.share_prefixes else "\x00predict"
        m = self.cache.match(prompt, key)
        queue_s = self.queue_seconds()
        cached = m.gpu_tokens + m.host_tokens + m.storage_tokens
        ttft = queue_s + ttft_seconds(self.timing, len(prompt), cached, m.host_tokens, m.storage_tokens)
        return Prediction(len(prompt), m.gpu_tokens, m.host_tokens, m.storage_tokens, queue_s, ttft)

    def restart(self) -> None:
        """Process restart: every request fails, GPU and host tiers are lost (storage kept)."""
        for ticket in [*self.waiting, *self.prefilling, *self.decoding]:
            self.abort(ticket, "The server is restarting.")
        self.cache.restart()

    def flush(self) -> bool:
        return not self.busy() and self.cache.flush()

    async def run(self) -> None:
        try:
            while True:
                step = self._form_step()
                if not step:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    await self._run_step(step)
                except Exception as exc:  # fail the step's requests, keep the replica serving
                    traceback.print_exc()
                    for ticket, _start, _end in step:
                        self.abort(ticket, f"Internal server error: {exc!r}")
        finally:
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ---- steps ------------------------------------------------------------------------------
    def _form_step(self) -> list[tuple[Ticket, int, int]]:
        """The in-progress chunked request's next chunk, then new requests while the budget lasts.

        As in SGLang's PrefillAdder, with chunked prefill on (``chunked_prefill_size`` > 0) the chunk size
        is a budget shared by the whole step (``rem_chunk_tokens`` shrinks with every request added): a
        chunked request mid-prompt takes all of it, so a new request waits for that request's last chunk
        and joins its step if what is left covers the new request's uncached prompt, or starts as the
        next chunked request with what is left (page-floored). ``max_prefill_tokens`` caps the step too.
        With chunked prefill off a request is never cut: one that does not fit the step's remaining
        ``max_prefill_tokens`` waits for the next step, unless it is the step's first.
        """
        chunking = self.limits.chunked_prefill_size > 0
        budget = self.limits.max_prefill_tokens
        if chunking:
            budget = min(budget, self.limits.chunked_prefill_size)
        step: list[tuple[Ticket, int, int]] = []
        for ticket in self.prefilling:
            take = min(len(ticket.work.prompt) - ticket.pos, budget)
            if take <= 0:
                break
            step.append((ticket, ticket.pos, ticket.pos + take))
            budget -= take
        while self.waiting and budget > 0:
            ticket = self.waiting[0]
            if self.running >= self.limits.max_running_requests:
                ticket.blocked = True  # it waits for a running request to end
                break
            # it must fit whole when chunking is off (unless first) or less than a page is left to cut
            whole = (not chunking and bool(step)) or (chunking and self._page_floor(budget) <= 0)
            admitted = self._admit(ticket, budget if whole else None)
            if admitted is None:
                break  # the step is too full for it: it waits for the next step
            if not admitted:
                ticket.blocked = True  # it waits for a running request to release memory
                break
            self.waiting.popleft()
            need = len(ticket.work.prompt) - ticket.pos
            take = need if need <= budget or not chunking else self._page_floor(budget)
            self.prefilling.append(ticket)
            step.append((ticket, ticket.pos, ticket.pos + take))
            budget -= take
        return step

    def _page_floor(self, tokens: int) -> int:
        page = max(1, self.limits.page_size)
        return tokens // page * page

    def _admit(self, ticket: Ticket, fit: int | None) -> bool | None:
        """Admit the head request: True, False (no memory: it must wait for a release), or None when
        `fit` is given and its uncached prompt would not fit in it (it would need chunking)."""
        work = ticket.work
        key = self._key(work)
        m = self.cache.match(work.prompt, key)
        reuse = m.gpu_tokens + m.host_tokens + m.storage_tokens
        if fit is not None and len(work.prompt) - min(reuse, len(work.prompt) - 1) > fit:
            return None
        output = sum(len(o) for o in work.outputs)
        adm = self.cache.admit(work.prompt, key, max(0, len(work.prompt) - reuse) + output)
        if adm is None:
            if not self.prefilling and not self.decoding:
                self.waiting.popleft()
                ticket.done = True
                msg = f"The request needs more KV cache than this replica has ({len(work.prompt)} tokens)."
                ticket.events.put_nowait(Failed(msg, 400))
                self._wake.set()
            return False
        short = reuse - adm.cached_tokens
        if short > 0:
            self.cache.extend(adm, short)
        ticket.admission = adm
        ticket.pos = min(adm.cached_tokens, max(0, len(work.prompt) - 1))
        ticket.load_s = self.timing.load_seconds(adm.host_loaded_tokens, adm.storage_loaded_tokens)
        ready = max(ticket.arrival, self._free_at, self._released_at if ticket.blocked else 0.0)
        ticket.ready = min(ready, self._now())
        queue_s = (ticket.ready - ticket.arrival) / self.limits.time_scale
        pre = Prefilled(
            adm.cached_tokens,
            adm.gpu_hit_tokens,
            adm.host_loaded_tokens,
            adm.storage_loaded_tokens,
            queue_s,
            ticket.arrival_cached,
        )
        ticket.events.put_nowait(pre)
        self.listener.on_admit(queue_s, pre, len(work.prompt))
        return True

    async def _run_step(self, step: list[tuple[Ticket, int, int]]) -> None:
        seconds = 0.0
        hit = new = 0
        for ticket, start, end in step:
            if ticket.kv_arrival is None:  # a PD decode's prompt KV is transferred, not computed
                seconds += self.timing.prefill_seconds(start, end)
            if ticket.load_s:
                seconds += ticket.load_s
                ticket.load_s = 0.0
            new += end - start
            if ticket.admission is not None and start == ticket.pos and start == _first_pos(ticket):
                hit += ticket.admission.cached_tokens
        self.listener.on_step(hit, new)
        delay = seconds * self.slow_factor * self.limits.time_scale
        now = self._now()
        base = min(now, max([self._free_at, *(t.ready for t, s, _e in step if s == _first_pos(t))]))
        self.step_end = base + delay
        self._step_ends = {ticket: end for ticket, _start, end in step}
        await asyncio.sleep(max(0.0, self.step_end - now))
        self._free_at = self.step_end
        self._step_ends = {}
        for ticket, _start, end in step:
            if ticket.done or ticket not in self.prefilling:
                continue
            ticket.pos = end
            self._cache_unfinished(ticket, end)
            if end >= len(ticket.work.prompt):
                self.prefilling.remove(ticket)
                self.decoding.add(ticket)
                self._spawn(ticket, self.step_end)
        if self.after_prefill is not None:
            self.after_prefill()

    def _cache_unfinished(self, ticket: Ticket, end: int) -> None:
        """SGLang's ``cache_unfinished_req`` after a forward: insert the prompt computed so far, so requests
        admitted from now on hit it. An intermediate chunk inserts with chunked=True (no hit counts); the
        last one with chunked=False, unless the request ends at its first token (then only `finish`
        inserts, as SGLang's cache_finished_req does right after the prefill)."""
        work, adm = ticket.work, ticket.admission
        if adm is None:
            return
        last = end >= len(work.prompt)
        if last and all(len(o) <= 1 for o in work.outputs):
            return
        self.cache.insert_unfinished(adm, work.prompt[:end], self._key(work), chunked=not last)

    def _spawn(self, ticket: Ticket, prefilled_at: float) -> None:
        task = asyncio.create_task(self._decode(ticket, prefilled_at))
        ticket.decode_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _decode(self, ticket: Ticket, prefilled_at: float) -> None:
        scale = self.limits.time_scale
        outputs = ticket.work.outputs
        counts = [min(1, len(o)) for o in outputs]
        active = sum(1 for o in outputs if len(o) > 1)
        first_at = prefilled_at + self.timing.overhead_seconds() * self.slow_factor * scale
        if ticket.kv_arrival is not None:  # PD decode: the prefill's token goes out as the KV lands
            await ticket.kv_arrival
            first_at = self._now()
        await asyncio.sleep(max(0.0, first_at - self._now()))
        self.decoding_seqs += active
        try:
            ticket.events.put_nowait(Emitted(tuple(counts)))
            self.listener.on_tokens(sum(counts))
            next_at = max(first_at, self._now())
            while any(c < len(o) for c, o in zip(counts, outputs, strict=True)):
                per_token = self.timing.decode_token_seconds(max(1, self.decoding_seqs))
                next_at += per_token * self.slow_factor * scale  # deadlines: no drift from late wake-ups
                await asyncio.sleep(max(0.0, next_at - self._now()))
                for i, o in enumerate(outputs):
                    if counts[i] < len(o):
                        counts[i] += 1
                        self.listener.on_tokens(1)
                        if counts[i] == len(o) and len(o) > 1:
                            self.decoding_seqs -= 1
                            active -= 1
                ticket.events.put_nowait(Emitted(tuple(counts)))
            self._release(ticket, insert=True)
            ticket.events.put_nowait(Finished())
        except Exception as exc:  # a bug must fail the request, not hang its client
            traceback.print_exc()
            if not ticket.done:
                with contextlib.suppress(Exception):
                    self._release(ticket, insert=False)
            ticket.done = True
            self.decoding.discard(ticket)
            ticket.events.put_nowait(Failed(f"Internal server error: {exc!r}", 500))
        finally:
            self.decoding_seqs -= active
            if not ticket.done:
                self._release(ticket, insert=False)

    # ---- helpers ----------------------------------------------------------------------------
    def _release(self, ticket: Ticket, insert: bool) -> None:
        if ticket.done:
            return
        ticket.done = True
        self._released_at = self._now()
        self.decoding.discard(ticket)
        adm = ticket.admission
        if adm is not None:
            if insert:
                seq = ticket.work.prompt + (ticket.work.outputs[0] if ticket.work.outputs else ())
                self.cache.finish(adm, seq, self._key(ticket.work))
            else:
                self.cache.abort(adm)
        self._wake.set()

    def _match_on_arrival(self, ticket: Ticket) -> None:
        """Matches the prompt against the cache as it is when the request arrives: what it held then
        (``Ticket.arrival_cached``) and the request's modelled prefill + load seconds from it (the
        queue estimate of the requests behind it)."""
        prompt = ticket.work.prompt
        m = self.cache.match(prompt, self._key(ticket.work))
        cached = m.gpu_tokens + m.host_tokens + m.storage_tokens
        ticket.arrival_cached = cached
        ttft = ttft_seconds(self.timing, len(prompt), cached, m.host_tokens, m.storage_tokens)
        ticket.est_prefill_s = ttft - self.timing.overhead_seconds()

    def _key(self, work: Work) -> str | None:
        return work.extra_key if self.limits.share_prefixes else f"\x00nocache:{work.rid}"

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


def _first_pos(ticket: Ticket) -> int:
    adm = ticket.admission
    if adm is None:
        return 0
    return min(adm.cached_tokens, max(0, len(ticket.work.prompt) - 1))
