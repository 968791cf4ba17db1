"""The compose CPU profile without containers: the same commands and config files, as processes on loopback.

Each container becomes a process with its own loopback address (127.A.B.x, A and B random), so every
one keeps the compose port (emulators 30000, gateways 8080) and the gateways' config file is used
unchanged: it discovers ``dns://sglang:30000``, and the name ``sglang`` is answered by a DNS server in
the test (tests/dnsserver.py) with the emulators' addresses, as Docker's DNS answers it with the
containers' (the only added flags: ``--host``, and ``--dns-server`` for that server). The image's entry
point is the ``kvroute`` command; container paths of bind mounts map back to the files in deploy/. Then
a request goes through each gateway with the openai SDK, and the image's health check script is run
against a gateway and an emulator.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.systems.procs import ManagedProcess
from tests.deploy.manifests import COMPOSE, DEPLOY, compose
from tests.dnsserver import DnsServer

pytestmark = pytest.mark.slow
KVROUTE = [str(Path(sys.executable).with_name("kvroute"))]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}  # compose passes none set


def free_subnet(ports: tuple[int, ...]) -> str:
    """``127.A.B`` where ``ports`` are free on .10 to .19 (nobody binds such addresses, but check)."""
    for _ in range(20):
        net = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
        try:
            for last in range(10, 20):
                for port in ports:
                    with socket.socket() as s:
                        s.bind((f"{net}.{last}", port))
        except OSError:
            continue
        return net
    raise RuntimeError("no free loopback subnet")


def host_path(service: dict[str, Any], arg: str) -> str:
    """A container path of a bind mount → the file in the repository (other arguments unchanged)."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if arg == target:
            return str((COMPOSE.parent / source).resolve())
    return arg


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # KEY=VALUE or a bare KEY, passed on only when set (here: never)
        return dict(e.split("=", 1) for e in env if "=" in e)
    return {k: str(v) for k, v in env.items() if v is not None}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    services = compose()["services"]
    (emulator,) = [s for s in services.values() if s.get("profiles") == ["cpu"]]
    gateways = [s for s in services.values() if s.get("command", [None])[0] == "serve"]
    net = free_subnet((30000, 8080))
    emu_hosts = [f"{net}.{10 + i}" for i in range(int(emulator["deploy"]["replicas"]))]
    gw_hosts = [f"{net}.{15 + i}" for i in range(len(gateways))]
    with DnsServer() as dns, ExitStack() as stack:
        dns.set("sglang", "A", *emu_hosts)
        for host in emu_hosts:
            argv = [*KVROUTE, *(host if a == "0.0.0.0" else a for a in emulator["command"])]
            env = {**ENV, **environment(emulator)}
            stack.enter_context(ManagedProcess(argv, [f"http://{host}:30000"], env=env, ready_timeout_s=60))
        urls = []
        for gw, host in zip(gateways, gw_hosts, strict=True):
            argv = [*KVROUTE, *(host_path(gw, a) for a in gw["command"]), "--host", host]
            argv += ["--dns-server", dns.address]
            url = f"http://{host}:8080"
            ready = ManagedProcess(
                argv,
                [url],
                env={**ENV, **environment(gw)},
                ready_timeout_s=60,
                ready_path="/ready",
                ready_check=lambda doc: doc.get("healthy_replicas") == len(emu_hosts),
            )
            stack.enter_context(ready)
            urls.append(url)
        yield {
            "gateways": urls,
            "replicas": [f"http://{h}:30000" for h in emu_hosts],
            "model": emulator["command"][emulator["command"].index("--served-model-name") + 1],
            "emulator": emulator,
        }


def test_a_request_goes_through_each_gateway_to_a_discovered_replica(stack: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "What does the cpu profile run? " * 8}]
    for url in stack["gateways"]:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(
            model=stack["model"],
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
        )
        chat = raw.parse()
        assert raw.headers["x-kvroute-replica"] in stack["replicas"]
        assert (
            chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 8
        )
        assert [m.id for m in client.models.list().data] == [stack["model"]]
        client.close()


def test_the_images_health_check_passes_on_live_servers_and_fails_on_a_dead_one(
    stack: dict[str, Any],
) -> None:
    emulator_url = stack["emulator"]["environment"]["HEALTHCHECK_URL"].replace(
        "127.0.0.1", stack["replicas"][0].split("//")[1].split(":")[0]
    )
    dead = stack["gateways"][0].replace(":8080", ":9") + "/health"
    expected = {stack["gateways"][1] + "/health": 0, emulator_url: 0, dead: 1}
    script = str(DEPLOY / "healthcheck.py")
    for url, code in expected.items():
        done = subprocess.run([sys.executable, script], env={**ENV, "HEALTHCHECK_URL": url}, timeout=30)
        assert done.returncode == code, url
