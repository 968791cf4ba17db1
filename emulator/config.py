"""Command-line flags of `kvroute emulate` → one frozen EmulatorConfig per process.

SGLang's own flag names (and 0.5.10 defaults) for everything the emulator models, so the relevant part of
a real SGLang launch line works unchanged. Any other `--flag [value]` is accepted and ignored with one
warning line per flag (collected in `ignored_flags`; the CLI prints them). Emulator-only flags start with
`--emu-`. `--kv-events-config` (SGLang's JSON) publishes KV events over ZMQ, in the encoding
`--emu-kv-events-format` picks (emulator/kv_events.py, emulator/kv_recorder.py). `--emu-tokenizer hf`
tokenizes with the real tokenizer directory `--tokenizer-path` (default: the model path) as SGLang does;
the default `pseudo` keeps the built-in pseudo-tokenizer (emulator/tokenizer_kind.py). The hardware profile
(`--emu-profile`, emulator/timing.py) sets the timing and, unless
`--emu-gpu-kv-tokens` / `--emu-kv-bytes-per-token` say otherwise, the GPU KV pool and the KV size of a
token. Derived sizes (GPU pool, host pool, mamba slots) are computed here, once:

    gpu = emu_gpu_kv_tokens * (1 - emu_hicache_gpu_cost if HiCache else 1), capped by --max-total-tokens,
          rounded down to a page;
    host = hicache_size GB / emu_kv_bytes_per_token, or floor(gpu * hicache_ratio) rounded up to a page
           plus one page (as SGLang's host pool);
    mamba slots (hybrid) = --max-mamba-cache-size (15), host slots = ratio x that.

Prefill/decode disaggregation (`--disaggregation-mode`, ...) is parsed by emulator/pd_config.py. Ports of
`--replicas N`: replica i takes HTTP port + i, bootstrap port + i and the KV-event ports + i*S (S keeps
publisher and replay ports apart); a layout that reuses a port is refused (emulator/port_plan.py).

Two defaults differ from SGLang's on purpose, so that clients work without extra flags: the served model
name is the short id "kvroute-emu" (SGLang: the model path, an absolute path here; the model path itself
still names the shipped tokenizer directory, which sglang-router loads), and tool calls are parsed
(`--tool-call-parser qwen25`; SGLang: none; `--tool-call-parser none` turns them off).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from emulator import pd_config, port_plan
from emulator.kv_events import KvEventsConfig
from emulator.kv_recorder import FORMATS as KV_EVENT_FORMATS
from emulator.pd_config import PdConfig
from emulator.timing import PROFILES
from emulator.tokenizer_kind import KINDS as TOKENIZER_KINDS

MODEL_DIR = Path(__file__).resolve().parent / "model"
SERVED_MODEL_NAME = "kvroute-emu"
"""The default model id (/v1/models, metrics' model_name); SGLang's default is the model path, which here
would be this machine's absolute path of emulator/model/. --served-model-name sets another."""
TOOL_CALL_PARSER = "qwen25"
"""The emulator parses tool calls by default (SGLang parses none unless --tool-call-parser is given);
--tool-call-parser none turns it off."""
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
SGLANG_VERSION = "0.5.10"
"""The SGLang release the emulator answers as (/server_info `version`, `--version`)."""


def version_line() -> str:
    """What `kvroute emulate --version` prints: kvroute's own version and the SGLang it emulates."""
    try:
        mine = version("kvroute")
    except PackageNotFoundError:  # a source tree without an installed distribution
        mine = "unknown"
    return f"kvroute emulate {mine} (emulates SGLang {SGLANG_VERSION})"


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    host: str = "127.0.0.1"
    ports: tuple[int, ...] = (30000,)
    model_path: str = str(MODEL_DIR)
    served_model_name: str = SERVED_MODEL_NAME
    tokenizer_path: str = str(MODEL_DIR)
    page_size: int = 1
    max_total_tokens: int | None = None
    max_running_requests: int = 128
    chunked_prefill_size: int = 2048
    max_prefill_tokens: int = 16384
    hicache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0
    hicache_write_policy: str = "write_through"
    hicache_storage_backend: str | None = None
    hicache_storage_backend_extra_config: str | None = None
    hicache_io_backend: str = "kernel"
    hicache_mem_layout: str = "layer_first"
    enable_metrics: bool = False
    enable_cache_report: bool = False
    enable_response_store: bool = False
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"
    max_mamba_cache_size: int | None = None
    mamba_scheduler_strategy: str = "auto"
    mamba_track_interval: int = 256
    tool_call_parser: str | None = TOOL_CALL_PARSER
    reasoning_parser: str | None = None
    context_length: int = 262144
    api_key: str | None = None
    admin_api_key: str | None = None
    random_seed: int = 0
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float = 0.88
    kv_cache_dtype: str = "auto"
    emu_profile: str = "rtx3090x2"
    time_scale: float = 1.0
    emu_gpu_kv_tokens: int = 233207
    emu_hicache_gpu_cost: float = 0.315
    emu_kv_bytes_per_token: int = 16384
    emu_hybrid: bool = False
    emu_storage_dir: str | None = None
    emu_enable_faults: bool = False
    emu_debug: bool = False
    emu_seed: int = 0
    kv_events: KvEventsConfig | None = None
    emu_kv_events_format: str = "0.5.10"
    emu_tokenizer: str = "pseudo"
    replica_index: int = 0  # this replica's place in --ports / --replicas (offsets its KV-event ports)
    kv_port_stride: int = 1  # KV-event ports of replica i: + i * this (port_plan.py)
    pd: PdConfig = field(default_factory=PdConfig)  # --disaggregation-* (pd_config.py); mode: this replica's
    pd_modes: tuple[str, ...] = ()  # the mode of every replica of the process, in port order
    ignored_flags: tuple[str, ...] = field(default=())

    def with_port(self, port: int) -> EmulatorConfig:
        """The config of the replica on `port` (one app per port)."""
        index = self.replica_index + (self.ports.index(port) if port in self.ports else 0)
        mode = self.pd_modes[index] if index < len(self.pd_modes) else self.pd.mode
        return replace(self, ports=(port,), replica_index=index, pd=replace(self.pd, mode=mode))

    @property
    def replica_kv_events(self) -> KvEventsConfig | None:
        """This replica's KV-event endpoints when publishing is on (ports offset by replica_index)."""
        if self.kv_events is None or not self.kv_events.enabled:
            return None
        return self.kv_events.for_replica(self.replica_index, self.kv_port_stride)

    @property
    def bootstrap_port(self) -> int:
        """This replica's PD bootstrap port (a prefill's; 0: any free port)."""
        base = self.pd.bootstrap_port
        return base + self.replica_index if base else 0

    @property
    def gpu_tokens(self) -> int:
        tokens = self.emu_gpu_kv_tokens
        if self.hicache:
            tokens = int(tokens * (1.0 - self.emu_hicache_gpu_cost))
        if self.max_total_tokens is not None:
            tokens = min(tokens, self.max_total_tokens)
        return tokens // self.page_size * self.page_size

    @property
    def host_tokens(self) -> int:
        if not self.hicache:
            return 0
        if self.hicache_size > 0:
            tokens = int(self.hicache_size * 1e9 // self.emu_kv_bytes_per_token)
            return tokens // self.page_size * self.page_size
        pages = math.ceil(self.gpu_tokens * self.hicache_ratio / self.page_size) + 1
        return pages * self.page_size

    @property
    def mamba_slots(self) -> int:
        return (self.max_mamba_cache_size or 15) if self.emu_hybrid else 0

    @property
    def host_mamba_slots(self) -> int:
        return int(self.mamba_slots * self.hicache_ratio) if self.emu_hybrid and self.hicache else 0

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_length - 1, self.gpu_tokens - 1)

    def storage_dir(self, port: int) -> Path:
        if self.emu_storage_dir:
            return Path(self.emu_storage_dir) / str(port)
        return Path(tempfile.gettempdir()) / f"kvroute-emu-storage-{port}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvroute emulate", description="Emulated SGLang replicas.")
    add = p.add_argument
    add("--version", action="version", version=version_line())
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=None)
    add(
        "--replicas",
        type=int,
        default=1,
        help="replica i serves HTTP on --port + i, a prefill's bootstrap server on "
        "--disaggregation-bootstrap-port + i, and KV events on the endpoint's and the replay endpoint's "
        "ports + i*S (S = 1, or |replay - endpoint| + 1 when that would reuse a port); a layout that "
        "reuses a port is refused (emulator/port_plan.py)",
    )
    add("--ports", default=None, help="comma-separated ports, one replica each")
    add("--model-path", "--model", default=str(MODEL_DIR))
    add(
        "--served-model-name",
        default=SERVED_MODEL_NAME,
        help=f"model id in /v1/models (default {SERVED_MODEL_NAME!r}; SGLang's default is the model path)",
    )
    add("--tokenizer-path", default=None)
    add("--page-size", type=int, default=1)
    add("--max-total-tokens", type=int, default=None)
    add("--max-running-requests", type=int, default=128)
    add("--chunked-prefill-size", type=int, default=2048)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--enable-hierarchical-cache", "--enable-hicache", dest="hicache", action="store_true")
    add("--hicache-ratio", type=float, default=2.0)
    add("--hicache-size", type=float, default=0.0)
    add("--hicache-write-policy", choices=WRITE_POLICIES, default="write_through")
    add("--hicache-storage-backend", default=None)
    add("--hicache-storage-backend-extra-config", default=None)
    add("--hicache-io-backend", default="kernel")
    add("--hicache-mem-layout", default="layer_first")
    add("--enable-metrics", action="store_true")
    add("--enable-cache-report", action="store_true")
    add(
        "--enable-response-store",
        action="store_true",
        help="keep /v1/responses objects in memory (previous_response_id, background, GET, cancel), "
        "as SGLang 0.5.23's flag of that name; off by default",
    )
    add("--disable-radix-cache", action="store_true")
    add("--schedule-policy", default="fcfs")
    add("--max-mamba-cache-size", type=int, default=None)
    add("--mamba-scheduler-strategy", default="auto")
    add("--mamba-track-interval", type=int, default=256)
    add(
        "--tool-call-parser",
        default=TOOL_CALL_PARSER,
        help=f"default {TOOL_CALL_PARSER!r}, unlike SGLang (which parses no tool calls unless set); "
        "'none' turns tool calls off",
    )
    add("--reasoning-parser", default=None)
    add("--context-length", type=int, default=262144)
    add("--api-key", default=None)
    add("--admin-api-key", default=None)
    add("--random-seed", type=int, default=0)
    add("--tp-size", "--tp", type=int, default=1)
    add("--dp-size", "--dp", type=int, default=1)
    add("--mem-fraction-static", type=float, default=0.88)
    add("--kv-cache-dtype", default="auto")
    add("--emu-profile", choices=sorted(PROFILES), default="rtx3090x2")
    add("--emu-time-scale", "--time-scale", dest="time_scale", type=float, default=1.0)
    add(
        "--emu-gpu-kv-tokens",
        type=int,
        default=None,
        help="GPU KV pool, HiCache off (default: the profile's)",
    )
    add("--emu-hicache-gpu-cost", type=float, default=0.315)
    add(
        "--emu-kv-bytes-per-token", type=int, default=None, help="KV bytes per token (default: the profile's)"
    )
    add("--emu-hybrid", action="store_true")
    add("--emu-storage-dir", default=None)
    add("--emu-enable-faults", action="store_true")
    add("--emu-debug", action="store_true")
    add("--emu-seed", type=int, default=0)
    add(
        "--kv-events-config",
        default=None,
        help="SGLang's KV-event publisher, JSON (emulator/kv_events.py); replica i publishes on the "
        "endpoint's port + i*S and replays on the replay endpoint's port + i*S (see --replicas)",
    )
    add(
        "--emu-kv-events-format",
        choices=KV_EVENT_FORMATS,
        default="0.5.10",
        help="KV-event encoding: 0.5.10 positional arrays (GPU only) or 0.5.23 tagged maps with tiers",
    )
    add(
        "--emu-tokenizer",
        choices=TOKENIZER_KINDS,
        default="pseudo",
        help="pseudo: the built-in pseudo-tokenizer and ChatML renderer; hf: --tokenizer-path's "
        "tokenizer.json and jinja2 chat_template, as SGLang tokenizes (emulator/hf_tokenizer.py)",
    )
    pd_config.add_flags(p)
    return p


def _tokenizer_dir(kind: str, path: str) -> str:
    """The tokenizer directory; with ``hf`` it must hold a tokenizer.json (checked at start-up)."""
    if kind == "hf" and not (Path(path) / "tokenizer.json").is_file():
        raise SystemExit(f"kvroute emulate: --emu-tokenizer hf needs {path}/tokenizer.json")
    return path


def _ignored(rest: Sequence[str]) -> tuple[str, ...]:
    """Names of unknown `--flag [value]` pairs; anything that is not such a pair is an error."""
    names: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("--") or arg.startswith("--emu-"):
            raise SystemExit(f"kvroute emulate: unrecognized argument {arg!r}")
        name = arg.split("=", 1)[0]
        if name not in names:
            names.append(name)
        has_value = "=" not in arg and i + 1 < len(rest) and not rest[i + 1].startswith("--")
        i += 2 if has_value else 1
    return tuple(names)


def _ports(ns: argparse.Namespace) -> tuple[int, ...]:
    if ns.ports:
        return tuple(int(p) for p in str(ns.ports).split(",") if p.strip())
    base = 30000 if ns.port is None else int(ns.port)
    return tuple(range(base, base + int(ns.replicas)))


def _or_profile(value: int | None, default: int) -> int:
    return default if value is None else value


def _kv_stride(ports: Sequence[int], pd: PdConfig, modes: Sequence[str], kv: KvEventsConfig | None) -> int:
    """The KV-event port stride of the replicas (port_plan.py); SystemExit when their ports clash."""
    stride = port_plan.kv_stride(kv, len(ports))
    base = pd.bootstrap_port
    bootstraps = [base + i if base and mode == "prefill" else None for i, mode in enumerate(modes)]
    try:
        port_plan.check(ports, bootstraps, kv, stride)
    except ValueError as exc:
        raise SystemExit(f"kvroute emulate: {exc}") from exc
    return stride


def parse_args(argv: Sequence[str]) -> EmulatorConfig:
    """Parse the command line; raises SystemExit on invalid flags (argparse style)."""
    ns, rest = _parser().parse_known_args(list(argv))
    if ns.hicache and ns.disable_radix_cache:
        raise SystemExit(
            "kvroute emulate: --enable-hierarchical-cache cannot be used with --disable-radix-cache"
        )
    if ns.time_scale <= 0:
        raise SystemExit("kvroute emulate: --emu-time-scale must be > 0")
    profile = PROFILES[ns.emu_profile]
    try:
        kv_events = None if ns.kv_events_config is None else KvEventsConfig.parse(ns.kv_events_config)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"kvroute emulate: {exc}") from exc
    ports = _ports(ns)
    modes = pd_config.modes(ns, len(ports))
    pd = pd_config.from_namespace(ns, ns.hicache, modes)
    cfg = EmulatorConfig(
        host=ns.host,
        ports=ports,
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or SERVED_MODEL_NAME,
        tokenizer_path=_tokenizer_dir(ns.emu_tokenizer, ns.tokenizer_path or ns.model_path),
        page_size=max(1, ns.page_size),
        max_total_tokens=ns.max_total_tokens,
        max_running_requests=ns.max_running_requests,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        hicache=ns.hicache,
        hicache_ratio=ns.hicache_ratio,
        hicache_size=ns.hicache_size,
        hicache_write_policy=ns.hicache_write_policy,
        hicache_storage_backend=ns.hicache_storage_backend,
        hicache_storage_backend_extra_config=ns.hicache_storage_backend_extra_config,
        hicache_io_backend=ns.hicache_io_backend,
        hicache_mem_layout=ns.hicache_mem_layout,
        enable_metrics=ns.enable_metrics,
        enable_cache_report=ns.enable_cache_report,
        enable_response_store=ns.enable_response_store,
        disable_radix_cache=ns.disable_radix_cache,
        schedule_policy=ns.schedule_policy,
        max_mamba_cache_size=ns.max_mamba_cache_size,
        mamba_scheduler_strategy=ns.mamba_scheduler_strategy,
        mamba_track_interval=ns.mamba_track_interval,
        tool_call_parser=None if ns.tool_call_parser in ("", "none") else ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        context_length=ns.context_length,
        api_key=ns.api_key,
        admin_api_key=ns.admin_api_key,
        random_seed=ns.random_seed,
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        mem_fraction_static=ns.mem_fraction_static,
        kv_cache_dtype=ns.kv_cache_dtype,
        emu_profile=ns.emu_profile,
        time_scale=ns.time_scale,
        emu_gpu_kv_tokens=_or_profile(ns.emu_gpu_kv_tokens, profile.gpu_kv_tokens),
        emu_hicache_gpu_cost=ns.emu_hicache_gpu_cost,
        emu_kv_bytes_per_token=_or_profile(ns.emu_kv_bytes_per_token, profile.kv_bytes_per_token),
        emu_hybrid=ns.emu_hybrid,
        emu_storage_dir=ns.emu_storage_dir,
        emu_enable_faults=ns.emu_enable_faults,
        emu_debug=ns.emu_debug,
        emu_seed=ns.emu_seed,
        kv_events=kv_events,
        emu_kv_events_format=ns.emu_kv_events_format,
        emu_tokenizer=ns.emu_tokenizer,
        kv_port_stride=_kv_stride(ports, pd, modes, kv_events),
        pd=pd,
        pd_modes=modes,
        ignored_flags=_ignored(rest),
    )
    return cfg
