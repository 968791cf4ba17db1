"""One emulated replica: its cache, engine, metrics, faults and debug logs, and the life of one request.

`Replica.build(cfg, port)` wires the pure pieces together (CacheConfig from the flags, the timing profile,
the engine limits, and with --kv-events-config the KV-event recorder and publisher). Route handlers turn
a parsed request into a `Job`, sample its outputs, call `Replica.open(request, job, completions)` and
read `Run.events()`; leaving the `Run` context before the request finished (client gone: aiohttp cancels
the handler) aborts it in the engine and counts it in num_aborted_requests_total, as SGLang does.
Streams are written by sse.py, faults applied by fault_hook.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from emulator.config import EmulatorConfig
from emulator.engine import Engine
from emulator.faults import Faults
from emulator.kv_events import KvEventPublisher
from emulator.kv_recorder import KvRecorder
from emulator.metrics import Metrics
from emulator.pd_stats import PdStats
from emulator.radix import CacheConfig, RadixCache
from emulator.request_log import AbortLog, RequestLog
from emulator.response_store import ResponseStore
from emulator.sampler import Completion, Sampler, Sampling
from emulator.storage import FileStorage
from emulator.tickets import Emitted, EngineLimits, Event, Failed, Finished, Prefilled, Ticket, Work
from emulator.timing import PROFILES, ProfileTiming
from emulator.tokenizer_kind import Tokenizer, make_tokenizer

STORAGE_CAPACITY_TOKENS = 50_000_000
WEIGHT_VERSION = "default"  # /model_info, meta_info and the OpenAI bodies' metadata


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed generation request, whatever the route."""

    prompt: tuple[int, ...]
    sampling: Sampling
    extra_key: str | None
    rid: str
    stream: bool


def new_rid() -> str:
    return uuid.uuid4().hex


def cache_config(cfg: EmulatorConfig, port: int) -> CacheConfig:
    storage = None
    if cfg.hicache and cfg.hicache_storage_backend == "file":
        directory = cfg.storage_dir(port)
        directory.mkdir(parents=True, exist_ok=True)
        storage = FileStorage(directory, STORAGE_CAPACITY_TOKENS)
    return CacheConfig(
        page_size=cfg.page_size,
        gpu_tokens=cfg.gpu_tokens,
        hicache=cfg.hicache,
        host_tokens=cfg.host_tokens,
        write_policy=cfg.hicache_write_policy,
        storage=storage,
        hybrid=cfg.emu_hybrid,
        mamba_slots=cfg.mamba_slots,
        host_mamba_slots=cfg.host_mamba_slots,
        mamba_track_interval=cfg.mamba_track_interval,
        mamba_extra_buffer=cfg.mamba_scheduler_strategy == "extra_buffer",
    )


DECODE_LOG_INTERVAL = 40
"""SGLang publishes queued KV events on the decode stats path every 40 decode steps."""


def kv_recorder(cfg: EmulatorConfig) -> KvRecorder | None:
    """The KV-event recorder of a replica, or None when it publishes nothing: no publisher, no radix cache
    (SGLang's ChunkCache has no events), or a hybrid model in the 0.5.10 encoding (its caches queue none)."""
    if cfg.replica_kv_events is None or cfg.disable_radix_cache:
        return None
    if cfg.emu_hybrid and cfg.emu_kv_events_format == "0.5.10":
        return None
    return KvRecorder(cfg.page_size, cfg.emu_kv_events_format)


@dataclass(eq=False, slots=True)
class Replica:
    cfg: EmulatorConfig
    port: int
    tokenizer: Tokenizer
    sampler: Sampler
    engine: Engine
    metrics: Metrics
    faults: Faults
    startup_time: float = field(default_factory=time.time)
    unhealthy_until: float = 0.0  # loop time until which /health answers 503 (after a restart)
    requests: RequestLog = field(default_factory=RequestLog)  # filled only with --emu-debug
    aborts: AbortLog = field(default_factory=AbortLog)  # rids named by /abort_request calls
    kv_events: KvEventPublisher | None = None  # --kv-events-config (started by the server)
    pd: PdStats = field(default_factory=PdStats.null)  # PD disaggregation's queues, figures (pd_stats.py)
    responses: ResponseStore = field(default_factory=ResponseStore)  # --enable-response-store

    @classmethod
    def build(cls, cfg: EmulatorConfig, port: int) -> Replica:
        if cfg.pd.mode == "decode":  # "KV cache is forced as chunk cache for decode server" (SGLang)
            cfg = replace(cfg, disable_radix_cache=True)
        tokenizer = make_tokenizer(cfg.emu_tokenizer, cfg.tokenizer_path)
        metrics = Metrics(
            cfg.served_model_name, cfg.mamba_slots, cfg.pd.mode if cfg.pd.enabled else "unified"
        )
        timing = ProfileTiming(PROFILES[cfg.emu_profile], hicache=cfg.hicache)
        limits = EngineLimits(
            max_running_requests=cfg.max_running_requests,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            time_scale=cfg.time_scale,
            share_prefixes=not cfg.disable_radix_cache,
            page_size=cfg.page_size,
        )
        recorder = kv_recorder(cfg)
        engine = Engine(RadixCache(cache_config(cfg, port), recorder), timing, limits, metrics)
        seed = cfg.emu_seed or cfg.random_seed
        replica = cls(cfg, port, tokenizer, Sampler(tokenizer, seed), engine, metrics, Faults())
        port_flag = cfg.bootstrap_port if cfg.pd.mode == "prefill" else cfg.pd.bootstrap_port
        replica.pd = PdStats(cfg.pd, port_flag, waiting=lambda: len(engine.waiting))
        if cfg.pd.enabled:
            replica.pd.attach(metrics.registry, metrics.labels)
        events_cfg = cfg.replica_kv_events
        if events_cfg is not None:
            take = recorder.take if recorder is not None else list
            interval = DECODE_LOG_INTERVAL * timing.decode_token_seconds(1) * cfg.time_scale
            replica.kv_events = KvEventPublisher(events_cfg, take, interval)
            engine.after_prefill = replica.kv_events.flush
        return replica

    @property
    def address(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    def publish_kv_events(self) -> None:
        """Publish the queued KV events now (after a flush or a restart: AllBlocksCleared)."""
        if self.kv_events is not None:
            self.kv_events.flush()

    def restart(self) -> None:
        self.responses.clear()  # in memory: a restarted SGLang has none of its stored responses
        self.engine.restart()
        self.publish_kv_events()
        self.startup_time = time.time()
        self.unhealthy_until = asyncio.get_running_loop().time() + self.cfg.time_scale

    def healthy(self) -> bool:
        return asyncio.get_running_loop().time() >= self.unhealthy_until

    def set_slow(self, factor: float) -> None:
        self.engine.slow_factor = factor

    @property
    def armed_faults(self) -> Faults | None:
        """The fault state when faults are enabled (--emu-enable-faults), else None."""
        return self.faults if self.cfg.emu_enable_faults else None

    def open(self, request: web.Request, job: Job, completions: tuple[Completion, ...]) -> Run:
        """Submit the job; its modelled timeline starts when the request arrived (not after parsing)."""
        outputs = tuple(c.ids for c in completions)
        work = Work(job.rid, job.prompt, job.extra_key, outputs)
        ticket = self.engine.submit(work, request.get(ARRIVAL))
        return Run(self, ticket)


@dataclass(eq=False, slots=True)
class Run:
    """Reads one ticket's events and records its latencies; aborts it when left early."""

    replica: Replica
    ticket: Ticket
    started: float = field(default_factory=time.monotonic)
    first: float | None = None
    prefilled: Prefilled | None = None
    counts: tuple[int, ...] = ()
    failure: Failed | None = None
    finished: bool = False

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.ticket.done:
            if self.replica.engine.abort(self.ticket, "client disconnected"):
                self.replica.metrics.on_abort()
        elif self.finished:
            self._record()

    async def events(self) -> AsyncGenerator[Event, None]:
        while not (self.finished or self.failure):
            event = await self.ticket.events.get()
            if isinstance(event, Prefilled):
                self.prefilled = event
            elif isinstance(event, Emitted):
                if self.first is None:
                    self.first = time.monotonic()
                self.counts = event.counts
            elif isinstance(event, Finished):
                self.finished = True
            elif isinstance(event, Failed):
                self.failure = event
            yield event

    @property
    def cached_tokens(self) -> int:
        return self.prefilled.cached_tokens if self.prefilled is not None else 0

    def cached_details(self) -> dict[str, Any] | None:
        """SGLang's cached_tokens_details: `{device, host}`, plus `storage` and `storage_backend` with an
        L3 backend; None before admission."""
        pre = self.prefilled
        if pre is None:
            return None
        details: dict[str, Any] = {"device": pre.device, "host": pre.host}
        if self.replica.cfg.hicache_storage_backend:
            details |= {"storage": pre.storage, "storage_backend": "HiCacheFile"}
        return details

    def elapsed(self) -> float:
        """Modelled seconds since the request arrived."""
        return (time.monotonic() - self.started) / self.replica.cfg.time_scale

    async def wait(self) -> None:
        async for _ in self.events():
            pass

    def _record(self) -> None:
        scale = self.replica.cfg.time_scale
        now = time.monotonic()
        ttft = None if self.first is None else (self.first - self.started) / scale
        total = sum(self.counts)
        itl = None
        if self.first is not None and total > len(self.counts):
            itl = (now - self.first) / scale / max(1, max(self.counts) - 1)
        self.replica.metrics.on_finish(ttft, (now - self.started) / scale, itl)


async def merged_events(runs: Sequence[Run]) -> AsyncGenerator[tuple[int, Event], None]:
    """The events of several runs (the prompts of a batch) as they come, each with its run's index."""
    if len(runs) == 1:
        async for event in runs[0].events():
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Event | None]] = asyncio.Queue()

    async def pump(k: int, run: Run) -> None:
        async for event in run.events():
            queue.put_nowait((k, event))
        queue.put_nowait((k, None))

    tasks = [asyncio.create_task(pump(k, run)) for k, run in enumerate(runs)]
    try:
        left = len(runs)
        while left:
            k, item = await queue.get()
            if item is None:
                left -= 1
            else:
                yield k, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def debug_headers(replica: Replica) -> dict[str, str]:
    return {"x-emu-replica": replica.address} if replica.cfg.emu_debug else {}


REPLICA = web.AppKey("replica", Replica)
ARRIVAL = web.RequestKey("arrival", float)
