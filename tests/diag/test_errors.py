"""Bad input and unusable URLs: one clear line on stderr and exit code 1 (argparse errors: 2), no crash."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
from collections.abc import Callable

import pytest
from aiohttp import web

from diag import ab, probe
from tests.conftest import Emulators, serve

Main = Callable[[list[str]], int]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(entry: Main, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = entry(list(argv))
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("entry", "name"), [(probe.main, "probe"), (ab.main, "ab")])
def test_unreachable_url(entry: Main, name: str) -> None:
    port = closed_port()
    code, out, err = run(entry, f"http://127.0.0.1:{port}", "--quiet")
    assert code == 1 and out == ""
    assert err.startswith(f"kvroute {name}: error: cannot connect to http://127.0.0.1:{port}")
    assert err.count("\n") == 1  # one line, no traceback


def _app(status: int, body: str, content_type: str) -> web.Application:
    async def anything(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@pytest.mark.parametrize(
    "app",
    [
        _app(200, "<html>a web page</html>", "text/html"),  # answers 200 to everything
        _app(404, '{"detail": "Not Found"}', "application/json"),
        _app(200, '{"status": "ok"}', "application/json"),  # JSON, but not SGLang's
    ],
)
async def test_a_server_that_is_not_sglang(app: web.Application) -> None:
    async with serve(app) as url:
        code, _, err = await asyncio.to_thread(run, probe.main, url, "--quiet")
    assert code == 1
    assert err == f"kvroute probe: error: {url} does not look like an SGLang server or a kvroute gateway " + (
        "(no SGLang /server_info, no kvroute /status)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["localhost:30000"], "is not an http:// or https:// URL"),
        (["http://127.0.0.1:30000", "--context-tokens", "0"], "must be positive"),
        (["http://127.0.0.1:30000", "--context-tokens", "many"], "is not an integer"),
        (["http://127.0.0.1:30000", "--timeout", "-1"], "must be positive"),
    ],
)
def test_bad_arguments(argv: list[str], message: str) -> None:
    code, _, err = run(probe.main, *argv)
    assert code == 2 and message in err


async def test_a_context_larger_than_the_replica_takes(emulator_server: Emulators) -> None:
    emu = await emulator_server("--max-total-tokens", "30000", "--emu-time-scale", "0.01")
    code, _, err = await asyncio.to_thread(run, probe.main, emu.url, "--quiet", "--context-tokens", "40000")
    assert code == 1 and "--context-tokens 40,000 exceeds" in err and "max_req_input_len 29,999" in err
    code, _, err = await asyncio.to_thread(run, ab.main, emu.url, "--quiet")
    assert code == 1 and "exceeds max_req_input_len 29,999" in err


async def test_an_api_key_is_asked_for_and_used(emulator_server: Emulators) -> None:
    emu = await emulator_server("--api-key", "s3cret", "--page-size", "1", "--emu-time-scale", "0.01")
    code, _, err = await asyncio.to_thread(run, probe.main, emu.url, "--quiet")
    assert code == 1 and "returned HTTP 401: pass --api-key" in err
    code, _, err = await asyncio.to_thread(run, ab.main, emu.url, "--quiet", "--api-key", "wrong")
    assert code == 1 and "the API key was refused" in err
    argv = ("--quiet", "--api-key", "s3cret", "--runs", "1", "--context-tokens", "2000")
    code, out, err = await asyncio.to_thread(run, ab.main, emu.url, *argv)
    assert code == 0 and "hot is" in out and "s3cret" not in out + err


async def test_a_plot_that_cannot_be_written(emulator_server: Emulators) -> None:
    emu = await emulator_server("--page-size", "1", "--emu-time-scale", "0.01")
    argv = ("--quiet", "--runs", "1", "--context-tokens", "2000", "--plot", "/nonexistent-dir/ab.png")
    code, out, err = await asyncio.to_thread(run, ab.main, emu.url, *argv)
    assert code == 1 and "hot is" in out  # the report is printed before the plot fails
    assert err.startswith("kvroute ab: error: cannot write the plot /nonexistent-dir/ab.png")
