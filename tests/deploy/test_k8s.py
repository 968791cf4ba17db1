"""deploy/k8s: every render (base, overlays gpu and cpu) builds with kustomize, validates against the
Kubernetes schemas (kubernetes-validate, strict, offline) and holds together: selectors select, the
gateway config is valid kvroute settings discovering the headless Service, SGLang runs write_back with
the template's caching flags, GPUs and /dev/shm in memory, the CPU overlay runs the emulator with the
same flags, the SGLang image pinned to a release; the ServiceMonitors (a CRD the schemas lack, so an
optional component, in no render by itself) select a Service with the port they scrape once included.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from emulator.config import parse_args
from proxy.config.settings import load_settings
from tests.deploy.manifests import DEPLOY, caching_flags, env_file, kustomize, launch_argv, one

RENDERS = ("base", "overlays/gpu", "overlays/cpu")
K8S_VERSIONS = ("1.30.0", "1.37.0")
_cache: dict[str, list[dict[str, Any]]] = {}


def render(path: str) -> list[dict[str, Any]]:
    if path not in _cache:
        _cache[path] = kustomize(path)
    return _cache[path]


def pod(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, kind, name)["spec"]["template"]
    return spec


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def expanded_argv(container: dict[str, Any]) -> list[str]:
    """command + args with Kubernetes' $(VAR) references replaced by the container's env values."""
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    argv = [*container.get("command", []), *container.get("args", [])]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in argv]


@pytest.mark.parametrize("path", RENDERS)
def test_every_object_validates_against_the_kubernetes_schemas(path: str) -> None:
    docs = render(path)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "StatefulSet", "ConfigMap", "Secret", "HorizontalPodAutoscaler"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked by test_service_monitors_select_what_they_scrape
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("path", RENDERS)
def test_the_gateways_are_highly_available_and_probed(path: str) -> None:
    docs = render(path)
    deploy = one(docs, "Deployment", "kvroute-gateway")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert (
        deploy["spec"]["replicas"] >= 2 and deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    )
    assert selects(
        one(docs, "PodDisruptionBudget", "kvroute-gateway")["spec"]["selector"]["matchLabels"], labels
    )
    hpa = one(docs, "HorizontalPodAutoscaler", "kvroute-gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "kvroute-gateway" and hpa["minReplicas"] >= 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "cpu" in container["resources"]["requests"]  # the HPA's utilisation needs a request
    service = one(docs, "Service", "kvroute")
    assert selects(service["spec"]["selector"], labels)
    port_names = {p["name"] for p in container["ports"]}
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("path", RENDERS)
def test_the_gateway_config_is_valid_and_discovers_the_headless_service(path: str, tmp_path: Path) -> None:
    docs = render(path)
    spec = pod(docs, "Deployment", "kvroute-gateway")["spec"]
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    config = one(docs, "ConfigMap", volume["configMap"]["name"])  # the generated name, hash suffix included
    assert container["args"][container["args"].index("--config") + 1] == f"{mount['mountPath']}/kvroute.toml"
    toml = tmp_path / "kvroute.toml"
    toml.write_text(config["data"]["kvroute.toml"])
    settings = load_settings(["--config", str(toml)], env={})
    (target,) = settings.discover
    port_name, proto, service_name = re.fullmatch(r"dns\+srv://_(\w+)\._(\w+)\.([\w-]+)", target).groups()  # type: ignore[union-attr]
    headless = one(docs, "Service", service_name)["spec"]
    assert headless["clusterIP"] == "None" and not headless.get("publishNotReadyAddresses", False)
    assert any(
        p["name"] == port_name and p.get("protocol", "TCP") == proto.upper() for p in headless["ports"]
    )
    assert one(docs, "StatefulSet", "sglang")["spec"]["serviceName"] == service_name
    key = next(e for e in container["env"] if e["name"] == "KVROUTE_ADMIN_KEY")["valueFrom"]["secretKeyRef"]
    assert one(docs, "Secret", key["name"])["stringData"][key["key"]]


@pytest.mark.parametrize("path", ["base", "overlays/gpu"])
def test_sglang_runs_the_templates_write_back_flags_on_gpus_with_memory_backed_shm(path: str) -> None:
    spec = pod(render(path), "StatefulSet", "sglang")["spec"]
    (container,) = spec["containers"]
    argv = expanded_argv(container)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    template = launch_argv({**env_file("dense-1gpu.env"), "HICACHE_STORAGE_DIR": "/var/cache/hicache"})
    assert caching_flags(argv) == caching_flags(template)
    assert caching_flags(argv)["--hicache-write-policy"] == "write_back"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    shm = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert next(v for v in spec["volumes"] if v["name"] == shm["name"])["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in container["env"]}
    storage = env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]
    claims = {
        c["metadata"]["name"]
        for c in one(render(path), "StatefulSet", "sglang")["spec"]["volumeClaimTemplates"]
    }
    assert any(m["mountPath"] == storage and m["name"] in claims for m in container["volumeMounts"])
    assert {
        p: container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")
    } == {
        "startupProbe": "/health",
        "readinessProbe": "/health",
        "livenessProbe": "/health",
    }


def test_the_cpu_overlay_runs_the_emulator_with_the_same_caching_flags() -> None:
    docs = render("overlays/cpu")
    sts = one(docs, "StatefulSet", "sglang")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("kvroute:") and container["args"][0] == "emulate"
    cfg = parse_args(container["args"][1:])
    assert cfg.ignored_flags == ()  # every flag is one the emulator models
    assert (cfg.hicache, cfg.hicache_write_policy, cfg.hicache_storage_backend) == (
        True,
        "write_back",
        "file",
    )
    assert cfg.enable_cache_report and cfg.enable_metrics and cfg.ports == (30000,)
    gpu = expanded_argv(pod(render("base"), "StatefulSet", "sglang")["spec"]["containers"][0])
    assert caching_flags(container["args"]) == caching_flags(gpu)
    assert "nvidia.com/gpu" not in str(docs) and "volumeClaimTemplates" not in sts["spec"]
    probes = [container[p] for p in ("readinessProbe", "livenessProbe")]
    assert all(p["httpGet"]["path"] == "/health" and p["timeoutSeconds"] > 1 for p in probes)  # it takes ~1 s
    port = next(p for p in one(docs, "Service", "sglang")["spec"]["ports"] if p["name"] == "http")
    assert port["port"] == 30000


@pytest.mark.parametrize("path", RENDERS)
def test_no_render_needs_the_prometheus_operator(path: str) -> None:
    """The ServiceMonitor CRD is not in a plain cluster: the base and overlays apply without it."""
    assert not [d for d in render(path) if d["apiVersion"].startswith("monitoring.coreos.com/")]


@pytest.mark.parametrize("path", ["base", "overlays/gpu"])
def test_the_sglang_image_is_pinned_to_a_release(path: str) -> None:
    (container,) = pod(render(path), "StatefulSet", "sglang")["spec"]["containers"]
    name, _, tag = container["image"].partition(":")
    assert name == "lmsysorg/sglang" and re.fullmatch(r"v\d+\.\d+\.\d+(\.post\d+)?(-cu\d+)?", tag), tag


def with_monitors(path: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``path`` with the optional component added, as an overlay of one's own would add it."""
    here = tmp_path / "monitored"
    here.mkdir()
    overlay, component = (  # kustomize takes relative paths only
        os.path.relpath(DEPLOY / "k8s" / p, here) for p in (path, "components/prometheus-operator")
    )
    (here / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: monitored\n"
        f"resources: [{overlay}]\ncomponents: [{component}]\n"
    )
    return kustomize(str(here))


@pytest.mark.parametrize("path", RENDERS)
def test_service_monitors_select_what_they_scrape(path: str, tmp_path: Path) -> None:
    docs = with_monitors(path, tmp_path)
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"kvroute-gateway", "sglang"}
    services = [d for d in docs if d["kind"] == "Service"]
    for m in monitors:
        assert m["apiVersion"] == "monitoring.coreos.com/v1"
        spec = m["spec"]
        matched = [
            s for s in services if selects(spec["selector"]["matchLabels"], s["metadata"].get("labels", {}))
        ]
        assert len(matched) == 1, m["metadata"]["name"]
        assert m["metadata"]["namespace"] == matched[0]["metadata"]["namespace"] == "monitored"
        names = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert all(e["port"] in names and e["path"] == "/metrics" for e in spec["endpoints"])
