"""``kvroute serve --workers 2`` as a real process tree (a supervisor and two gateway workers on one port)
in front of in-process emulated replicas. Every request goes on a fresh connection, so the kernel spreads
them over both workers (the access log, one line per request with its worker, shows both served).

Whichever worker takes it, a repeated prefix lands on the replica that holds it and a session stays on
its replica; a warm-up job is known to both and the response cache answers for both; a tenant limited to
N requests a minute gets at most N (+1) through them, with the local channel or with Redis; a killed worker
is restarted; SIGTERM drains every worker; workers leave when their supervisor is killed."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import MODEL, Emulators
from tests.proxy.conftest import ADMIN, ADMIN_KEY, EMU_FLAGS
from tests.proxy.gateway_proc import GatewayProcess, gateway_process

TIMEOUT = aiohttp.ClientTimeout(total=30)
LIMIT = 6
KEY = "sk-limited"
KEYS = orjson.dumps([{"key": KEY, "tenant": "tiny", "requests_per_minute": LIMIT}]).decode()


async def fleet(emulators: Emulators, n: int, *flags: str) -> str:
    return ",".join([(await emulators(*EMU_FLAGS, *flags)).url for _ in range(n)])


def workers(log: Path, backends: str, *flags: str) -> Any:
    base = ("--workers", "2", "--backend", backends, "--health-interval", "0.1", "--access-log")
    return gateway_process(log, *base, "--policy", "cost", *flags)


async def fresh(method: str, url: str, **kw: Any) -> tuple[int, Any, dict[str, str]]:
    """One request on a connection of its own (the kernel picks the worker)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as s,
        s.request(method, url, **kw) as r,
    ):
        return r.status, await r.json(content_type=None), dict(r.headers)


def document(i: int) -> str:
    return f"Document {i}: " + " ".join(f"fact{i}-{k}" for k in range(300))


async def chat(
    url: str, content: str, question: str, headers: dict[str, str] | None = None
) -> tuple[str, int]:
    messages = [{"role": "system", "content": content}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    status, doc, got = await fresh("POST", url + "/v1/chat/completions", json=body, headers=headers)
    assert status == 200, doc
    details = doc["usage"].get("prompt_tokens_details") or {}
    return got["x-kvroute-replica"], int(details.get("cached_tokens") or 0)


def served_by(log: Path) -> dict[str, int]:
    """Requests per worker, from the access log lines."""
    found = re.findall(r"kvroute\.access\[worker (\d+)\]", log.read_text())
    return {w: found.count(w) for w in set(found)}


def pids(log: Path) -> dict[int, int]:
    """The latest pid of each worker, from the supervisor's log."""
    return {int(w): int(p) for w, p in re.findall(r"worker (\d+) started \(pid (\d+)\)", log.read_text())}


async def settle() -> None:
    await asyncio.sleep(0.5)  # the workers' sync rounds (a few ms each through the channel)


async def ready(gw: GatewayProcess) -> None:
    """Both workers answer /ready (several in a row, on fresh connections)."""
    ok = 0
    for _ in range(200):
        ok = ok + 1 if (await fresh("GET", gw.url + "/ready"))[0] == 200 else 0
        if ok >= 8:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the workers did not become ready")


async def test_repeats_and_sessions_reach_their_holder_whichever_worker_takes_them(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    backends = await fleet(emulator_server, 3)
    log = tmp_path / "gw.log"
    async with workers(log, backends) as gw:
        await ready(gw)
        first = {i: (await chat(gw.url, document(i), "first?"))[0] for i in range(6)}
        await settle()
        for i in range(6):
            for k in range(3):
                replica, cached = await chat(gw.url, document(i), f"again {k}?")
                assert replica == first[i] and cached > 0, (i, k)
        for session in range(3):
            headers = {"x-session-id": f"conversation-{session}"}
            seen = set()
            for turn in range(3):
                seen.add((await chat(gw.url, f"turn {turn} of {session}", "go on", headers))[0])
                await asyncio.sleep(0.3)  # the turn's record reaches the other worker
            assert len(seen) == 1, session
        gw.signal(signal.SIGTERM)
        assert await gw.exit_status(20) == 0
    assert set(served_by(log)) == {"0", "1"}


@pytest.mark.parametrize("store", ["channel", "redis"])
async def test_a_tenants_limit_holds_across_the_workers(
    emulator_server: Emulators, tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    backends = await fleet(emulator_server, 1)
    state: tuple[str, ...] = ()
    if store == "redis":
        state = ("--state", request.getfixturevalue("redis_server").url)
    log = tmp_path / "gw.log"
    async with workers(log, backends, "--api-keys", KEYS, *state) as gw:
        await ready(gw)
        answers = []
        for i in range(30):
            body = {"model": MODEL, "prompt": f"q{i}", "max_tokens": 2}
            headers = {"Authorization": f"Bearer {KEY}"}
            answers.append(await fresh("POST", gw.url + "/v1/completions", json=body, headers=headers))
    assert LIMIT <= [a[0] for a in answers].count(200) <= LIMIT + 1
    for status, doc, headers in answers:
        if status != 200:
            assert status == 429 and int(headers["Retry-After"]) >= 1
            assert (
                doc["error"]["type"] == "rate_limit_error" and doc["error"]["code"] == "rate_limit_exceeded"
            )
    assert set(served_by(log)) == {"0", "1"}
    if store == "redis":
        assert "kvroute+unix" not in log.read_text()  # every worker on Redis: no channel


async def test_warmups_and_the_response_cache_are_shared_by_the_workers(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    backends = await fleet(emulator_server, 3)
    log = tmp_path / "gw.log"
    async with workers(log, backends, "--admin-key", ADMIN_KEY, "--response-cache", "memory") as gw:
        await ready(gw)
        doc = {"id": "d", "messages": [{"role": "system", "content": document(42)}]}
        body = {"model": MODEL, "documents": [doc], "wait": True}
        status, job, _ = await fresh("POST", gw.url + "/v1/warmup", json=body, headers=ADMIN)
        assert status == 200 and job["status"] == "done"
        (placed,) = job["documents"][0]["replicas"]
        known = 0  # the job is known to both workers (they publish their jobs every second)
        for _ in range(100):
            found = (await fresh("GET", gw.url + f"/v1/warmup/{job['id']}", headers=ADMIN))[0] == 200
            known = known + 1 if found else 0
            if known >= 8:
                break
            await asyncio.sleep(0.05)
        assert known >= 8
        replica, cached = await chat(gw.url, document(42), "first real question?")
        assert replica == placed["replica"] and cached > 0
        ask = {"model": MODEL, "prompt": "a deterministic question", "max_tokens": 4, "temperature": 0}
        results = [(await fresh("POST", gw.url + "/v1/completions", json=ask))[2]["x-kvroute-cache"]]
        results += [
            (await fresh("POST", gw.url + "/v1/completions", json=ask))[2]["x-kvroute-cache"]
            for _ in range(8)
        ]
        assert results == ["miss"] + ["hit"] * 8
    assert set(served_by(log)) == {"0", "1"}


async def test_a_responses_chain_continues_on_whichever_worker(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    """Without --state, the Responses state lives in the supervisor's hub: every turn of a chain, each
    on a fresh connection, finds its history whichever worker takes it, and so does a GET."""
    backends = await fleet(emulator_server, 2)
    log = tmp_path / "gw.log"
    async with workers(log, backends) as gw:
        await ready(gw)
        previous, seen, ids = None, [], []
        for turn in range(8):
            body = {"model": MODEL, "input": f"turn {turn}", "max_output_tokens": 4}
            if previous is not None:
                body["previous_response_id"] = previous
            status, doc, _ = await fresh("POST", gw.url + "/v1/responses", json=body)
            assert status == 200, doc  # an unknown previous_response_id would be a 404
            previous = doc["id"]
            ids.append(previous)
            seen.append(doc["usage"]["input_tokens"])
        assert seen == sorted(set(seen))  # each turn carried the whole chain before it to the replica
        for rid in ids:
            status, doc, _ = await fresh("GET", gw.url + f"/v1/responses/{rid}")
            assert status == 200 and doc["id"] == rid
    assert set(served_by(log)) == {"0", "1"}


async def _stream(url: str, started: asyncio.Event) -> bytes:
    body = {"model": MODEL, "prompt": "tell a long story", "max_tokens": 500, "stream": True}
    out = b""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for chunk in r.content.iter_any():
            out += chunk
            started.set()
    return out


async def test_a_killed_worker_comes_back_and_sigterm_drains_every_worker(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    slow = ("--emu-time-scale", "0.1")  # a 500-token stream lasts ~1.3 s
    backends = await fleet(emulator_server, 1, *slow)
    log = tmp_path / "gw.log"
    async with workers(log, backends, "--drain-timeout", "20") as gw:
        await ready(gw)
        first = pids(log)
        os.kill(first[0], signal.SIGKILL)
        for _ in range(400):
            if pids(log)[0] != first[0] and "worker 0 ready" in log.read_text():
                break
            await asyncio.sleep(0.05)
        assert "worker 0 (pid" in log.read_text() and "restarting in" in log.read_text()
        await ready(gw)
        started = asyncio.Event()
        streaming = asyncio.create_task(_stream(gw.url, started))
        await asyncio.wait_for(started.wait(), 10)
        gw.signal(signal.SIGTERM)
        body = await streaming
        assert body.rstrip().endswith(b"data: [DONE]")  # the stream in flight finished
        assert await gw.exit_status(20) == 0
    assert log.read_text().count("kvroute.drain[worker") >= 2
    assert all(not _alive(p) for p in pids(log).values())


async def test_workers_leave_when_their_supervisor_is_killed(
    emulator_server: Emulators, tmp_path: Path
) -> None:
    backends = await fleet(emulator_server, 1)
    log = tmp_path / "gw.log"
    async with workers(log, backends) as gw:
        await ready(gw)
        children = pids(log)
        gw.signal(signal.SIGKILL)
        await gw.exit_status(10)
        for _ in range(200):
            if not any(_alive(p) for p in children.values()):
                break
            await asyncio.sleep(0.05)
        assert not any(_alive(p) for p in children.values())
        assert "the supervisor is gone: draining" in log.read_text()
    home = re.search(r"kvroute\+unix://(/[^\"]+)/hub\.sock", log.read_text())
    assert home is not None
    shutil.rmtree(home.group(1), ignore_errors=True)  # a killed supervisor could not remove it


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that its dead parent left is reaped by init: gone too)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


async def test_a_taken_port_fails_the_start() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        argv = [sys.executable, "-m", "proxy.cli", "serve", "--workers", "2", "--admin-key", "k"]
        argv += ["--port", str(taken.getsockname()[1])]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        taken.close()
    assert proc.returncode == 1 and out == b""
    assert b"cannot listen on 127.0.0.1:" in err
