"""What a new user hits in the first hour (issue 11), each pinned: backends, silent failures, readiness,
model names, OpenAI-shaped errors where kvroute answers, malformed HTTP, start-up mistakes, the CLI and
the access log."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.config.settings import SettingsError, load_settings
from proxy.front import operations
from proxy.runtime.ready_line import announce
from tests.conftest import Emulators, StartGateway, wait_for
from tests.proxy.conftest import EMU_FLAGS, MODEL, StackFactory
from tests.proxy.gateway_proc import gateway_process

JSON = {"Content-Type": "application/json"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "a secret prompt"}], "max_tokens": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- settings ---------------------------------------------------------------------------------------
def test_backends_are_comma_or_space_separated_and_repeatable() -> None:
    argv = [
        "--backend",
        "http://a:1,http://b:2",
        "--backend",
        "http://c:3 http://d:4",
        "--backend",
        "http://a:1",
    ]
    assert load_settings(argv, env={}).backends == ("http://a:1", "http://b:2", "http://c:3", "http://d:4")
    several = [
        "--backend",
        "http://a:1",
        "http://b:2",
        "--port",
        "9000",
        "--backend",
        "http://c:3,http://d:4",
    ]
    settings = load_settings(several, env={})  # several after one flag, as sglang-router's --worker-urls
    assert settings.backends == ("http://a:1", "http://b:2", "http://c:3", "http://d:4")
    assert settings.port == 9000
    env = {"KVROUTE_BACKEND": "http://e:5 http://f:6"}
    assert load_settings([], env=env).backends == ("http://e:5", "http://f:6")
    with pytest.raises(SettingsError, match="backend"):
        load_settings(["--backend", "http://a:port"], env={})
    aliases = load_settings(["--model-alias", "gpt-4o=qwen", "--model-alias", "default=qwen"], env={})
    assert aliases.model_aliases == (("gpt-4o", "qwen"), ("default", "qwen"))
    with pytest.raises(SettingsError, match="model_alias"):
        load_settings(["--model-alias", "gpt-4o"], env={})


# ---- a backend that cannot be reached ---------------------------------------------------------------
async def test_an_unreachable_backend_is_logged_counted_and_not_ready_until_it_answers(
    emulator_server: Emulators, gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    caplog.set_level(logging.INFO, logger="kvroute.fleet")
    gw = await gateway([f"http://127.0.0.1:{port}"], health_interval=0.1)
    url = gw.url
    down = [r for r in caplog.records if r.name == "kvroute.fleet" and "unreachable" in r.getMessage()]
    assert len(down) == 1 and down[0].levelno == logging.WARNING and str(port) in down[0].getMessage()
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/ready") as r:
            assert r.status == 503 and (await r.json())["healthy_replicas"] == 0
        async with s.get(url + "/health") as r:
            assert r.status == 200  # alive, just not ready
        async with s.get(url + "/metrics") as r:
            assert f'kvroute_replica_healthy{{replica="http://127.0.0.1:{port}"}} 0.0' in await r.text()
        for path in ("/v1/chat/completions", "/v1/completions"):  # no replica answered: no model is known
            async with s.post(url + path, data=orjson.dumps({**CHAT, "prompt": "hi"}), headers=JSON) as r:
                err = (await r.json())["error"]
                assert r.status == 503 and err["code"] == "no_replica_available" and err["param"] is None
                assert (
                    f"http://127.0.0.1:{port} (/health: unreachable (connection refused))" in err["message"]
                )
        async with s.get(url + "/v1/models/default") as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "no_replica_available"
        await asyncio.sleep(0.5)  # five more failed checks: no new line (at most one a minute)
        assert (
            len([r for r in caplog.records if r.name == "kvroute.fleet" and "unreachable" in r.getMessage()])
            == 1
        )
        await emulator_server(*EMU_FLAGS, "--served-model-name", MODEL, port=port)
        await wait_for(lambda: any("healthy again" in r.getMessage() for r in caplog.records))
        async with s.get(url + "/ready") as r:
            assert r.status == 200
        async with s.get(url + "/metrics") as r:
            assert f'kvroute_replica_healthy{{replica="http://127.0.0.1:{port}"}} 1.0' in await r.text()


# ---- the ready line -----------------------------------------------------------------------------------
async def test_the_ready_line_waits_for_a_healthy_replica_and_says_what_it_waits_for(
    emulator_server: Emulators, gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    caplog.set_level(logging.INFO, logger="kvroute.ready")
    gw = await gateway([f"http://127.0.0.1:{port}"], health_interval=0.1)
    out = io.StringIO()
    task = asyncio.create_task(announce(gw.url, partial(operations.awaited, gw.app), out))
    await wait_for(lambda: any("not ready" in r.getMessage() for r in caplog.records))
    waiting = [r.getMessage() for r in caplog.records if r.name == "kvroute.ready"]
    assert (
        len(waiting) == 1
        and f"http://127.0.0.1:{port} (/health: unreachable (connection refused))" in waiting[0]
    )
    assert out.getvalue() == "" and not task.done()  # /ready answers 503: no ready line
    await emulator_server(*EMU_FLAGS, "--served-model-name", MODEL, port=port)
    await asyncio.wait_for(task, 10)
    assert out.getvalue().startswith(f"kvroute ready {gw.url} ")
    assert (
        len([r for r in caplog.records if r.name == "kvroute.ready" and "not ready" in r.getMessage()]) == 1
    )


async def test_kvroute_serve_prints_ready_only_once_a_replica_is_healthy(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    port = _free_port()
    flags = ("--backend", f"http://127.0.0.1:{port}", "--health-interval", "0.1")
    async with gateway_process(tmp_path / "gw.log", *flags, ready=False) as gw:
        log_text = (tmp_path / "gw.log").read_text
        await wait_for(lambda: "is not ready: waiting for a healthy replica" in log_text(), 20)
        assert f"http://127.0.0.1:{port} (/health: unreachable (connection refused))" in log_text()
        await emulator_server(*EMU_FLAGS, "--served-model-name", MODEL, port=port)
        assert gw.proc.stdout is not None
        line = (await asyncio.wait_for(gw.proc.stdout.readline(), 20)).decode()
        assert line.startswith("kvroute ready http://127.0.0.1:")


async def test_kvroute_serve_without_replicas_is_ready_to_be_given_some(tmp_path: Path) -> None:
    """--admin-key alone: nothing to wait for, so the line comes once it listens; /ready stays 503."""
    async with (
        gateway_process(tmp_path / "gw.log", "--admin-key", "k") as gw,
        aiohttp.ClientSession() as s,
        s.get(gw.url + "/ready") as r,
    ):
        assert r.status == 503 and (await r.json())["replicas"] == 0


# ---- model names ------------------------------------------------------------------------------------
async def test_model_names_exact_alias_single_model_fallback_and_404(stack_factory: StackFactory) -> None:
    one = await stack_factory(n=2)
    two = await stack_factory(models=[MODEL, "other-model"], model_aliases=(("gpt-4o", "other-model"),))
    async with aiohttp.ClientSession() as s:
        for name in ("default", "gpt-4o"):  # one model served: any name is it, as SGLang accepts any
            body = orjson.dumps({**CHAT, "model": name})
            async with s.post(one.url + "/v1/chat/completions", data=body, headers=JSON) as r:
                assert r.status == 200 and (await r.json())["model"] == name
        alias = orjson.dumps({**CHAT, "model": "gpt-4o"})
        async with s.post(two.url + "/v1/chat/completions", data=alias, headers=JSON) as r:
            assert r.status == 200 and r.headers["x-kvroute-replica"] == two.urls[1]  # the alias
        unknown = orjson.dumps({**CHAT, "model": "default"})
        async with s.post(two.url + "/v1/chat/completions", data=unknown, headers=JSON) as r:
            err = (await r.json())["error"]
            assert r.status == 404 and err["code"] == "model_not_found" and "other-model" in err["message"]
        async with s.get(two.url + "/v1/models/gpt-4o") as r:
            card = await r.json()
            assert r.status == 200 and card["id"] == "gpt-4o" and card["root"] == "other-model"


# ---- errors kvroute answers itself --------------------------------------------------------------------
async def test_methods_a_route_does_not_take_get_an_openai_shaped_405(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    async with aiohttp.ClientSession() as s:
        for method, path, allow in [
            ("GET", "/v1/chat/completions", "POST"),
            ("GET", "/v1/completions", "POST"),
            ("GET", "/generate", "POST, PUT"),
            ("POST", "/health", "GET, HEAD"),
        ]:
            async with s.request(method, stack.url + path) as r:
                assert r.status == 405 and r.headers["Allow"].replace(" ", "") == allow.replace(" ", "")
                assert set((await r.json())["error"]) == {"message", "type", "param", "code"}
    assert await stack.generations() == []


async def test_a_passed_through_error_in_another_shape_is_reshaped(stack_factory: StackFactory) -> None:
    """The emulator serves no /v1/embeddings (a generation model): its text 404 reaches the client as
    OpenAI's JSON; a path off the pass-through's allowlist never reaches a replica at all."""
    stack = await stack_factory(n=1)
    body = b'{"input": "hi"}'
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/embeddings", data=body) as r:
        doc = await r.json()
        assert r.status == 404 and r.headers["x-kvroute-replica"] == stack.urls[0]  # relayed, re-shaped
        assert doc["error"]["code"] == 404 and "Not Found" in doc["error"]["message"]
    async with aiohttp.ClientSession() as s, s.post(stack.url + "/v1/no-such-endpoint", data=b"{}") as r:
        doc = await r.json()
        assert r.status == 404 and "x-kvroute-replica" not in r.headers
        assert doc["error"]["type"] == "invalid_request_error" and "/v1/embeddings" in doc["error"]["message"]


async def test_malformed_http_gets_json_and_one_line_without_the_clients_bytes(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await stack_factory(n=1)
    host, port = stack.url.removeprefix("http://").split(":")
    for raw in (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Secret: tok\x01en\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nhello",
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(raw)
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400" and b"application/json" in head
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error" and b"tok" not in body
    logged = [r for r in caplog.records if r.name in ("kvroute.http", "aiohttp.server")]
    assert [r.levelno for r in logged] == [logging.WARNING] * 2 and not any(r.exc_info for r in logged)
    assert not any("tok" in r.getMessage() for r in logged)


# ---- start-up mistakes and the CLI -------------------------------------------------------------------
def _kvroute(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "proxy.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_port_in_use_and_nothing_to_route_to_are_one_line_each() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _kvroute("serve", "--port", str(port), "--backend", "http://127.0.0.1:9")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip().splitlines()[-1].startswith(f"kvroute serve: cannot listen on 127.0.0.1:{port}")
    )
    nothing = _kvroute("serve")
    assert nothing.returncode == 2 and nothing.stderr.count("\n") == 1 and "--backend" in nothing.stderr


def test_version_help_defaults_and_a_closed_pipe() -> None:
    assert _kvroute("--version").stdout.startswith("kvroute ")
    helped = _kvroute("serve", "--help").stdout
    assert "(default: 127.0.0.1)" in helped and "(default: cost)" in helped and "--access-log" in helped
    shell = subprocess.run(  # `kvroute -h | head -1`: the reader leaves early
        f"{sys.executable} -m proxy.cli -h | head -1", shell=True, capture_output=True, text=True, timeout=30
    )
    assert shell.stdout.startswith("usage: kvroute") and "Traceback" not in shell.stderr


# ---- the access log -----------------------------------------------------------------------------------
async def test_the_access_log_has_one_line_per_request_and_no_prompt_text(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await stack_factory(n=1, access_log=True)
    caplog.set_level(logging.INFO, logger="kvroute.access")
    async with aiohttp.ClientSession() as s:
        async with s.post(stack.url + "/v1/chat/completions", data=orjson.dumps(CHAT), headers=JSON) as r:
            assert r.status == 200
        async with s.post(stack.url + "/v1/chat/completions", data=b"{", headers=JSON) as r:
            assert r.status == 400
    lines = [r.getMessage() for r in caplog.records if r.name == "kvroute.access"]
    ok, bad = (line for line in lines if "/v1/chat/completions" in line)
    assert ok.startswith("POST /v1/chat/completions 200 ") and f"replica={stack.urls[0]}" in ok
    assert "reason=" in ok and "prompt=" in ok and "completion=3" in ok and "attempts=1" in ok
    assert bad.startswith("POST /v1/chat/completions 400 ") and "replica=-" in bad
    assert not any("secret" in line for line in lines)
