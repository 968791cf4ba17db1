"""Flags of prefill/decode (PD) disaggregation (pd-contract.md §2.1, §3) → one frozen PdConfig.

SGLang's own flags: `--disaggregation-mode null|prefill|decode` (default null; the emulator also takes a
comma-separated list, one mode per replica of `--replicas`/`--ports`, so that one process can serve
prefills and decodes that pair in-process), `--disaggregation-transfer-
backend` (mooncake; `fake` is decode-only, as SGLang asserts), `--disaggregation-bootstrap-port` (8998, the
prefill's bootstrap server; with `--replicas N` replica i listens on port + i, see port_plan.py),
`--disaggregation-ib-device`, `--num-reserved-decode-tokens` (512) and `--load-balance-method` (auto:
follow_bootstrap_room on prefill, round_robin otherwise). Their side effects: a decode server runs without
a radix cache ("KV cache is forced as chunk cache for decode server"), so HiCache on decode is refused.

Emulator flags: `--emu-kv-transfer-gb-s`, the modelled prefill→decode KV rate, and the two SGLang timeouts,
which SGLang takes only from its environment (`SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`,
`SGLANG_DISAGGREGATION_WAITING_TIMEOUT`, 300 s each): the flags default to those variables when they are
set, as SGLang reads them. The heartbeat (`SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL` 5 s, at least 2;
`SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE` 2) comes from the environment only. Every duration is in
modelled seconds: a replica multiplies it by its time scale.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DEFAULT_BOOTSTRAP_PORT = 8998
"""SGLang's `--disaggregation-bootstrap-port` default (server_args.py, pd-contract.md §2.1)."""
DEFAULT_KV_TRANSFER_GB_S = 20.0
"""The modelled KV-transfer rate, GB/s (1e9 bytes/s, as SGLang's `kv_transfer_speed_gb_s`). Source:
pd-contract.md §3 — llm-d `docs/architecture/advanced/disaggregation/README.md` @a14492ca gives "typical BW"
20-50 GB/s for InfiniBand and 10-25 GB/s for RoCEv2 (1-3 GB/s for TCP); 20 GB/s is the low end of
InfiniBand and the top of RoCEv2, the contract's suggested default (Mooncake's 87 and 190 GB/s are
node aggregates over 4-8 NICs)."""
DEFAULT_TIMEOUT_S = 300.0
"""SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and SGLANG_DISAGGREGATION_WAITING_TIMEOUT (environ.py)."""
HANDSHAKE_ATTEMPTS = 15
"""A decode resolves a prefill's bootstrap server with up to 15 tries, at least 1 s apart (decode.py)."""
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""SGLang's FAKE_BOOTSTRAP_HOST: a request naming it gets the fake transfer (no peer), as /health's probe."""


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class PdConfig:
    mode: str = "null"
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    transfer_backend: str = "mooncake"
    ib_device: str | None = None
    num_reserved_decode_tokens: int = 512
    load_balance_method: str = "auto"
    kv_transfer_gb_s: float = DEFAULT_KV_TRANSFER_GB_S
    bootstrap_timeout_s: float = DEFAULT_TIMEOUT_S
    waiting_timeout_s: float = DEFAULT_TIMEOUT_S
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failure: int = 2

    @property
    def enabled(self) -> bool:
        return self.mode != "null"

    @property
    def resolved_load_balance_method(self) -> str:
        """`auto` resolves to follow_bootstrap_room on a prefill and round_robin elsewhere (§2.1)."""
        if self.load_balance_method != "auto":
            return self.load_balance_method
        return "follow_bootstrap_room" if self.mode == "prefill" else "round_robin"

    @property
    def fake_transfer(self) -> bool:
        """A decode on the `fake` backend receives fake KV for every request (no prefill, no room)."""
        return self.mode == "decode" and self.transfer_backend == "fake"

    def transfer_seconds(self, prompt_tokens: int, bytes_per_token: int) -> float:
        """Modelled seconds to send a prompt's KV: SGLang transfers the whole prompt, cached part included."""
        return prompt_tokens * bytes_per_token / (self.kv_transfer_gb_s * 1e9)


def add_flags(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add(
        "--disaggregation-mode",
        default="null",
        help="null, prefill or decode (SGLang's); or one of them per replica, comma-separated",
    )
    add("--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS, default="mooncake")
    add(
        "--disaggregation-bootstrap-port",
        type=int,
        default=DEFAULT_BOOTSTRAP_PORT,
        help=f"the prefill's bootstrap server (default {DEFAULT_BOOTSTRAP_PORT}, as SGLang); with --replicas "
        "N replica i listens on this port + i; 0 picks a free port (reported in /server_info)",
    )
    add("--disaggregation-ib-device", default=None)
    add("--num-reserved-decode-tokens", type=int, default=512)
    add("--load-balance-method", default="auto")
    add(
        "--emu-kv-transfer-gb-s",
        type=float,
        default=DEFAULT_KV_TRANSFER_GB_S,
        help="modelled prefill->decode KV-transfer rate in GB/s (1e9 bytes/s): transfer time = prompt "
        "tokens x KV bytes per token / rate. Default 20: llm-d's typical InfiniBand 20-50 GB/s and RoCEv2 "
        "10-25 GB/s (TCP 1-3), llm-d docs/architecture/advanced/disaggregation/README.md, pd-contract.md §3",
    )
    add(
        "--emu-disaggregation-bootstrap-timeout",
        type=float,
        default=_env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", DEFAULT_TIMEOUT_S),
        help="modelled s a prefill holds a request for its decode (SGLang's "
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300)",
    )
    add(
        "--emu-disaggregation-waiting-timeout",
        type=float,
        default=_env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", DEFAULT_TIMEOUT_S),
        help="modelled s a decode waits for a room's KV once registered (SGLang's "
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default 300)",
    )


def modes(ns: argparse.Namespace, replicas: int) -> tuple[str, ...]:
    """The mode of each replica: one for all, or one each (a comma-separated list of `replicas` modes)."""
    given = tuple(m.strip() for m in str(ns.disaggregation_mode).split(","))
    if any(m not in MODES for m in given):
        raise SystemExit(
            f"kvroute emulate: --disaggregation-mode takes {', '.join(MODES)} (or one per replica)"
        )
    if len(given) not in (1, replicas):
        raise SystemExit(
            f"kvroute emulate: --disaggregation-mode lists {len(given)} modes for {replicas} replicas"
        )
    return given * replicas if len(given) == 1 else given


def from_namespace(ns: argparse.Namespace, hicache: bool, modes: tuple[str, ...]) -> PdConfig:
    """The PD config of parsed flags (`mode`: the first replica's); SystemExit for what SGLang refuses."""
    if "prefill" in modes and ns.disaggregation_transfer_backend == "fake":
        raise SystemExit("kvroute emulate: --disaggregation-transfer-backend fake is for decode servers only")
    if "decode" in modes and hicache:
        raise SystemExit(
            "kvroute emulate: a decode server runs without a radix cache (SGLang forces it), so "
            "--enable-hierarchical-cache and --disaggregation-mode decode are mutually exclusive"
        )
    positive = (ns.emu_kv_transfer_gb_s, ns.emu_disaggregation_bootstrap_timeout)
    if min(*positive, ns.emu_disaggregation_waiting_timeout) <= 0:
        raise SystemExit("kvroute emulate: the KV-transfer rate and the PD timeouts must be > 0")
    if not 0 <= ns.disaggregation_bootstrap_port <= 65535:
        raise SystemExit("kvroute emulate: --disaggregation-bootstrap-port must be a port (0-65535)")
    return PdConfig(
        mode=modes[0],
        bootstrap_port=ns.disaggregation_bootstrap_port,
        transfer_backend=ns.disaggregation_transfer_backend,
        ib_device=ns.disaggregation_ib_device,
        num_reserved_decode_tokens=ns.num_reserved_decode_tokens,
        load_balance_method=ns.load_balance_method,
        kv_transfer_gb_s=ns.emu_kv_transfer_gb_s,
        bootstrap_timeout_s=ns.emu_disaggregation_bootstrap_timeout,
        waiting_timeout_s=ns.emu_disaggregation_waiting_timeout,
        heartbeat_interval_s=max(2.0, _env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)),
        heartbeat_max_failure=int(_env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)),
    )
