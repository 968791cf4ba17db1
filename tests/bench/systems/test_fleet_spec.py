"""FleetSpec's exact-mode options: the emulator parses the flags they add into a tokenizer directory and
per-replica KV-event endpoints that match `kv_endpoints`; without them the flags are as before."""

from __future__ import annotations

import socket

from bench.systems.fleet import FleetSpec, free_port_run
from emulator.config import parse_args
from emulator.model_bpe import make_tokenizer

BPE = str(make_tokenizer.HERE)


def test_default_spec_adds_no_exact_mode_flags() -> None:
    args = FleetSpec(3, 24_000, 0.05).args(7)
    assert not {"--emu-tokenizer", "--kv-events-config", "--tokenizer-path"} & set(args)
    cfg = parse_args(args)
    assert (
        cfg.emu_tokenizer == "pseudo"
        and cfg.kv_events is None
        and "tokenizer" not in FleetSpec(3, 1, 1).meta()
    )


def test_tokenizer_and_kv_events_reach_every_replica() -> None:
    spec = FleetSpec(3, 24_000, 0.05, tokenizer=BPE, kv_events="0.5.23")
    cfg = parse_args([*spec.args(7, kv_port=41_000), "--ports", "30000,30001,30002"])
    assert (cfg.emu_tokenizer, cfg.tokenizer_path, cfg.model_path) == ("hf", BPE, BPE)
    assert cfg.emu_kv_events_format == "0.5.23"
    endpoints = [cfg.with_port(p).replica_kv_events for p in cfg.ports]
    assert [e.endpoint for e in endpoints if e is not None] == spec.kv_endpoints(41_000)
    assert spec.meta()["tokenizer"] == BPE and spec.meta()["kv_events"] == "0.5.23"


def test_free_port_run_is_consecutive_and_free() -> None:
    base = free_port_run(4)
    socks = [socket.socket() for _ in range(4)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()
    cfg = parse_args(FleetSpec(4, 1000, 1.0, kv_events="0.5.10").args(0))
    assert cfg.kv_events is not None and cfg.kv_events.endpoint.startswith("tcp://127.0.0.1:")
