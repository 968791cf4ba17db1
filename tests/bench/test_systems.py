"""System templates expand as documented; the oracle picks the lowest true cost and rotates ties."""

from __future__ import annotations

import sys

import pytest

from bench import cli, systems
from bench.oracle import OracleState
from bench.procs import free_ports
from bench.workloads import GENERATORS


def test_template_expansion_of_port_python_backends_and_backend_args() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    argv = systems.expand(
        ("{python}", "-m", "x", "--port", "{port}", "--w", "{backends}", "{backend_args}"), 9, urls
    )
    assert argv == [sys.executable, "-m", "x", "--port", "9", "--w", *urls,
                    "--backend", urls[0], "--backend", urls[1]]  # fmt: skip


def test_selection_by_name_and_group() -> None:
    names = [s.name for s in systems.default_systems()]
    assert {"kvroute-cost", "sglang-cache_aware", "client-rr", "oracle"} <= set(names)
    assert [s.name for s in systems.select(["sglang"])] == [f"sglang-{p}" for p in systems.SGLANG_POLICIES]
    assert [s.name for s in systems.select(["oracle", "client-rr"])] == ["client-rr", "oracle"]
    with pytest.raises(ValueError, match="unknown systems"):
        systems.select(["nope"])


def test_free_ports_are_distinct() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6 and all(p > 0 for p in ports)


def test_oracle_picks_lowest_predicted_ttft_plus_pending_and_rotates_ties() -> None:
    state = OracleState(["a", "b", "c"])
    pred = {"a": {"ttft_s": 2.0, "queue_s": 0.0}, "b": {"ttft_s": 0.4, "queue_s": 0.0}, "c": {"ttft_s": 2.0}}
    assert state.choose(pred) == "b"
    state.pending["b"] = 5.0
    assert state.choose(pred) in {"a", "c"}
    state.pending["b"] = 0.0
    ties = {"a": {"ttft_s": 1.0}, "b": {"ttft_s": 1.0}, "c": {"ttft_s": 1.0}}
    assert {state.choose(ties) for _ in range(3)} == {"a", "b", "c"}


def test_cli_parses_workloads_systems_and_time_scale() -> None:
    cfg = cli.parse(
        ["probe", "agent", "--systems", "oracle,sglang", "--quick", "--time-scale", "0.5", "--no-readme"]
    )
    assert cfg.workloads == ("probe", "agent") and cfg.quick and cfg.readme is None
    assert cfg.time_scale == 0.5 and cfg.fleet.replicas == 4
    assert [s.name for s in cfg.systems][-1] == "oracle" and len(cfg.systems) == 4
    assert cli.parse([]).workloads == tuple(GENERATORS)
    assert cli.parse([]).all_seeds == (1,) and cli.parse(["--seed", "7"]).all_seeds == (7,)
    assert cli.parse(["--seeds", "1, 2,3"]).all_seeds == (1, 2, 3)
    with pytest.raises(SystemExit):
        cli.parse(["--seeds", "1,x"])
    with pytest.raises(SystemExit):
        cli.parse(["nosuch"])
    assert cli.main(["--systems", "nosuch"]) == 2
