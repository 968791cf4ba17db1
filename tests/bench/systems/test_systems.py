"""System templates expand as documented; the oracle picks the lowest true cost and rotates ties."""

from __future__ import annotations

import sys

import pytest

from bench import cli, point
from bench.runs import plan
from bench.systems import registry as systems
from bench.systems.oracle import OracleState
from bench.systems.procs import free_ports
from bench.workloads.generators import GENERATORS


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


def test_cli_parses_a_custom_plan_systems_and_time_scale() -> None:
    cfg = cli.parse(["probe", "rag", "--systems", "oracle,sglang", "--quick", "--time-scale", "0.5",
                     "--load", "0.3,0.9", "--profile", "h200"])  # fmt: skip
    assert [(p.profile, p.load, p.workloads) for p in cfg.points] == [
        ("h200", 0.3, ("rag",)),
        ("h200", 0.9, ("rag",)),
        ("h200", None, ("probe",)),
    ]
    assert cfg.run.quick and cfg.readme is None and cfg.run.out_dir == cli.QUICK_OUT  # quick: not bench/
    assert cfg.run.time_scale == 0.5 and cfg.run.fleet.replicas == 4
    assert [s.name for s in cfg.run.systems][-1] == "oracle" and len(cfg.run.systems) == 4
    assert cli.parse(["rag", "--seeds", "1, 2,3"]).points[0].seeds == (1, 2, 3)
    variants = cli.parse(["rag_restart", "rag_tenants", "--load", "0.6", "--seeds", "1"]).points
    assert [(p.load, p.workloads) for p in variants] == [(0.6, ("rag_restart", "rag_tenants"))]
    for bad in (["--seeds", "1,x"], ["nosuch"], ["--load", "0"], ["--profile", "tpu"]):
        with pytest.raises(SystemExit):
            cli.parse(bad)
    assert cli.main(["--systems", "nosuch"]) == 2


def test_the_default_plan_and_the_matrix() -> None:
    cfg = cli.parse([])
    assert cfg.points == plan.default_plan() and cfg.readme is not None
    assert sorted(s.name for s in cfg.run.systems) == sorted(plan.SWEEP_SYSTEMS)
    points = {(p.profile, p.load, p.workloads): p for p in cfg.points}
    sweep, variants = plan.SWEEP_WORKLOADS, plan.VARIANT_WORKLOADS
    assert points[("rtx3090x2", 0.6, sweep)].seeds == (1, 2, 3) and points[("h200", 0.6, sweep)].seeds == (1,)
    assert {("rtx3090x2", x, sweep) for x in (0.3, 0.9)} <= points.keys()
    assert [(p.profile, p.load, p.seeds) for p in cfg.points if p.workloads == variants] == [
        ("rtx3090x2", 0.6, (1,))  # the rag variants: at the default point only
    ]
    assert ("rtx3090x2", None, ("agent", "probe")) in points
    matrix = cli.parse(["--matrix"])
    assert sorted(w for p in matrix.points for w in p.workloads) == sorted(GENERATORS)
    assert len(matrix.run.systems) == len(systems.default_systems())


def test_the_h200_profile_runs_twice_as_slow_unless_the_time_scale_is_given() -> None:
    def scale(argv: list[str], profile: str) -> float:
        cfg = cli.parse(["noreuse", "--quick", *argv])
        at = plan.Point(profile, 0.6, (1,), ("noreuse",))
        return point.prepare(cfg.run, at, "noreuse", 1).fleet.time_scale

    assert scale([], "rtx3090x2") == 0.2 and scale([], "h200") == 0.4
    assert scale(["--time-scale", "0.3"], "h200") == 0.3
