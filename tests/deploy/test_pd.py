"""deploy/ for prefill/decode fleets: the SGLang launch template's PD flags, the compose file
(docker-compose.pd.yml) and the Kubernetes overlay (overlays/pd) hold together: prefill servers with HiCache
write_back, --disaggregation-mode prefill and a bootstrap port; decode servers without HiCache (SGLang refuses
it there); both on Mooncake; emulated servers with the same flags; a gateway config that discovers both."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from emulator.config import parse_args
from proxy.config.settings import load_settings
from tests.deploy.manifests import DEPLOY, caching_flags, env_file, kustomize, launch_argv, one
from tests.deploy.test_k8s import K8S_VERSIONS, expanded_argv

COMPOSE_PD = DEPLOY / "compose" / "docker-compose.pd.yml"


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def launch(role: str) -> list[str]:
    return launch_argv({**env_file(f"pd-{role}.env"), "MODEL_PATH": "m"})


def test_the_launch_template_gives_each_role_sglangs_pd_flags() -> None:
    prefill, decode = launch("prefill"), launch("decode")
    assert (flag(prefill, "--disaggregation-mode"), flag(decode, "--disaggregation-mode")) == (
        "prefill",
        "decode",
    )
    assert (
        flag(prefill, "--disaggregation-bootstrap-port") == "8998"
        and "--disaggregation-bootstrap-port" not in decode
    )
    assert (
        flag(prefill, "--disaggregation-transfer-backend")
        == flag(decode, "--disaggregation-transfer-backend")
        == "mooncake"
    )
    assert caching_flags(prefill)["--hicache-write-policy"] == "write_back"
    assert not any(f.startswith("--hicache") or f == "--enable-hierarchical-cache" for f in decode)
    for argv in (prefill, decode):  # SGLang's own flags, each one known (the emulator parses SGLang's)
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert parse_args(argv[3:]).ignored_flags == ()
    for key in ("--page-size", "--kv-cache-dtype", "--tp-size"):  # what the handshake checks
        assert flag(prefill, key) == flag(decode, key)
    assert launch_argv({"MODEL_PATH": "m", "IB_DEVICE": "mlx5_0", "DISAGGREGATION_MODE": "decode"})[-2:] == [
        "--disaggregation-ib-device",
        "mlx5_0",
    ]


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE_PD.read_text())
    return doc


def services(profile: str) -> dict[str, dict[str, Any]]:
    return {k: s for k, s in compose()["services"].items() if s.get("profiles") == [profile]}


def test_the_compose_file_validates_and_runs_two_prefill_and_two_decode_servers(tmp_path: Path) -> None:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(compose())] == []
    gpu = services("gpu")
    roles = {k: Path(s["env_file"]).name for k, s in gpu.items()}
    assert sorted(roles.values()) == ["pd-decode.env"] * 2 + ["pd-prefill.env"] * 2
    devices = sorted(
        d["device_ids"][0] for s in gpu.values() for d in s["deploy"]["resources"]["reservations"]["devices"]
    )
    assert devices == ["0", "1", "2", "3"]
    for name, s in gpu.items():
        alias = "sglang-prefill" if roles[name] == "pd-prefill.env" else "sglang-decode"
        assert (
            s["networks"]["default"]["aliases"] == [alias]
            and "/dev/infiniband:/dev/infiniband" in s["devices"]
        )
        assert (COMPOSE_PD.parent / s["env_file"]).exists()
    gateway = compose()["services"]["gateway"]
    source = gateway["volumes"][0].split(":")[0]
    settings = load_settings(["--config", str(COMPOSE_PD.parent / source)], env={})
    assert settings.discover == ("dns://sglang-prefill:30000", "dns://sglang-decode:30000")


def test_the_emulated_servers_run_the_gpu_servers_flags() -> None:
    emulated = services("cpu")
    by_alias = {s["networks"]["default"]["aliases"][0]: s["command"] for s in emulated.values()}
    for alias, role in (("sglang-prefill", "prefill"), ("sglang-decode", "decode")):
        command = by_alias[alias]
        cfg = parse_args(command[1:])
        assert command[0] == "emulate" and cfg.ignored_flags == () and cfg.pd.mode == role
        gpu = launch(role)
        assert caching_flags(command) == caching_flags(gpu)
        assert flag(command, "--disaggregation-transfer-backend") == flag(
            gpu, "--disaggregation-transfer-backend"
        )
    assert flag(by_alias["sglang-prefill"], "--disaggregation-bootstrap-port") == "8998"


def test_the_kubernetes_overlay_replaces_the_unified_statefulset_with_prefill_and_decode(
    tmp_path: Path,
) -> None:
    docs = kustomize("overlays/pd")
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
    assert not [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "sglang"]
    for role in ("prefill", "decode"):
        sts = one(docs, "StatefulSet", f"sglang-{role}")
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        argv = expanded_argv(container)
        assert parse_args(argv[3:]).pd.mode == role
        template = launch(role)
        assert caching_flags(argv) == caching_flags(template)
        service = one(docs, "Service", sts["spec"]["serviceName"])["spec"]
        assert service["clusterIP"] == "None" and any(p["name"] == "http" for p in service["ports"])
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("kvroute-config")
    )
    toml = tmp_path / "kvroute.toml"
    toml.write_text(config["data"]["kvroute.toml"])
    assert load_settings(["--config", str(toml)], env={}).discover == (
        "dns+srv://_http._tcp.sglang-prefill",
        "dns+srv://_http._tcp.sglang-decode",
    )
