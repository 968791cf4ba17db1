"""deploy/compose: the file validates against the compose-spec JSON schema (the copy that check-jsonschema
ships, with jsonschema; the machine has a docker client without the compose plugin, so `docker compose
config` is not available) and holds together: two gateways on one valid kvroute config, Redis,
Prometheus, Grafana, GPU replicas on distinct GPUs through the SGLang launch template, emulated replicas
with the same caching flags, every replica under the alias the gateways discover, mounted files present.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from emulator.config import parse_args
from proxy.config.settings import load_settings
from tests.deploy.manifests import COMPOSE, caching_flags, compose, env_file, launch_argv

THEIRS = ("../prometheus/", "../grafana")  # the metrics helper's files: mounted here, written there


def services(profile: str | None) -> dict[str, dict[str, Any]]:
    """The services started with ``--profile profile`` that have it (None: those with no profile)."""
    all_: dict[str, dict[str, Any]] = compose()["services"]
    return {k: s for k, s in all_.items() if s.get("profiles", [None]) == [profile]}


def test_the_file_validates_against_the_compose_spec_schema() -> None:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_two_gateways_share_one_valid_config_beside_redis_prometheus_and_grafana(tmp_path: Path) -> None:
    always = services(None)
    assert {"redis", "prometheus", "grafana"} <= always.keys()
    gateways = {k: s for k, s in always.items() if s.get("command", [None])[0] == "serve"}
    assert len(gateways) == 2
    host_ports = {p.split(":")[0] for s in gateways.values() for p in s["ports"]}
    assert len(host_ports) == 2
    mounts = {v for s in gateways.values() for v in s["volumes"]}
    (mount,) = mounts
    source, target = mount.split(":")[:2]
    for s in gateways.values():
        assert s["command"][s["command"].index("--config") + 1] == target
    settings = load_settings(["--config", str(COMPOSE.parent / source)], env={})
    assert settings.discover == ("dns://sglang:30000",) and settings.backends == ()


def test_every_replica_is_under_the_alias_and_port_the_gateways_discover() -> None:
    replicas = {**services("gpu"), **services("cpu")}
    assert len(services("gpu")) >= 2 and len(services("cpu")) == 1
    for name, s in replicas.items():
        assert s["networks"]["default"]["aliases"] == ["sglang"], name
    (emulator,) = services("cpu").values()
    assert parse_args(emulator["command"][1:]).ports == (30000,) and emulator["deploy"]["replicas"] >= 2
    gpu_argv = launch_argv({**env_file("dense-1gpu.env"), "MODEL_PATH": "m"})
    assert gpu_argv[gpu_argv.index("--port") + 1] == "30000"


def test_gpu_replicas_take_one_distinct_gpu_each_and_launch_write_back() -> None:
    gpu = services("gpu")
    devices = [
        d["device_ids"] for s in gpu.values() for d in s["deploy"]["resources"]["reservations"]["devices"]
    ]
    assert sorted(map(tuple, devices)) == [(str(i),) for i in range(len(gpu))]
    for s in gpu.values():
        script = next(v.split(":")[0] for v in s["volumes"] if v.split(":")[1] == s["entrypoint"][1])
        assert (COMPOSE.parent / script).resolve() == (COMPOSE.parent / "../sglang/launch.sh").resolve()
        env = {**env_file(Path(s["env_file"]).name), "MODEL_PATH": "m"}
        flags = caching_flags(launch_argv(env))
        assert flags["--hicache-write-policy"] == "write_back" and flags["--enable-cache-report"] is True
        assert s["ulimits"]["memlock"] == -1 and s["ipc"] == "host"


def test_the_sglang_image_is_pinned_to_a_release() -> None:
    for name, s in services("gpu").items():
        default = re.fullmatch(r"\$\{SGLANG_IMAGE:-(.+)\}", s["image"])
        assert default is not None, name
        image, _, tag = default.group(1).partition(":")
        assert image == "lmsysorg/sglang" and re.fullmatch(r"v\d+\.\d+\.\d+(\.post\d+)?(-cu\d+)?", tag), tag


def test_the_emulated_replicas_run_the_gpu_replicas_caching_flags() -> None:
    (emulator,) = services("cpu").values()
    command = emulator["command"]
    assert command[0] == "emulate" and parse_args(command[1:]).ignored_flags == ()
    gpu_argv = launch_argv({**env_file("dense-1gpu.env"), "MODEL_PATH": "m"})
    assert caching_flags(command) == caching_flags(gpu_argv)
    assert emulator["environment"]["HEALTHCHECK_URL"].endswith(":30000/health")


def test_mounted_files_exist(request: pytest.FixtureRequest) -> None:
    missing, theirs = [], []
    for name, s in compose()["services"].items():
        for volume in s.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                continue  # a named volume or a host path such as the Hugging Face cache
            if not (COMPOSE.parent / source).exists():
                (theirs if source.startswith(THEIRS) else missing).append(f"{name}: {source}")
    assert missing == []
    if theirs:  # not ours to write: reported, not failed
        request.node.user_properties.append(("missing files of deploy/prometheus, deploy/grafana", theirs))
