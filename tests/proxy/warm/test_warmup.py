"""The warm-up API against emulated replicas: the contract and its errors, placement, live requests
finding warmed prefixes, host-tier survival (write_back) versus none (HiCache off), re-warm after a
restart, and steps that yield to live traffic."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.warm.api import WARMUPS
from tests.proxy.conftest import ADMIN, EMU_FLAGS, MODEL, StackFactory, wait_for
from tests.proxy.exact.test_exact_keys import DIR as BPE

JSON = {"Content-Type": "application/json"}
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
]


def document(seed: int, words: int = 3000) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] + str(i % 97) for i in range(words))


async def warm(url: str, body: dict[str, Any], headers: dict[str, str] = ADMIN) -> tuple[int, dict[str, Any]]:
    data = io.BytesIO(orjson.dumps(body))  # aiohttp streams a file-like body (no warning for large ones)
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/warmup", data=data, headers={**JSON, **headers}) as r,
    ):
        return r.status, await r.json()


async def ask(url: str, messages: list[dict[str, str]]) -> tuple[str, int]:
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 2})
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", data=body, headers=JSON) as r,
    ):
        doc = await r.json()
        assert r.status == 200, doc
        details = doc["usage"]["prompt_tokens_details"]  # null when nothing was cached (SGLang 0.5.10)
        return r.headers["x-kvroute-replica"], int(details["cached_tokens"]) if details else 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": 5, "documents": [{"text": "x"}]}, "model"),
        ({"model": MODEL, "documents": []}, "documents"),
        ({"model": MODEL, "documents": [{"id": "a"}]}, "documents[0]"),
        ({"model": MODEL, "documents": [{"text": "x", "messages": []}]}, "documents[0]"),
        ({"model": MODEL, "documents": [{"text": 5}]}, "documents[0].text"),
        ({"model": MODEL, "documents": [{"messages": [{"content": "no role"}]}]}, "messages[0]"),
        ({"model": MODEL, "documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, "documents"),
        ({"model": MODEL, "documents": [{"text": "x"}] * 1001}, "documents"),
        ({"model": MODEL, "documents": [{"text": "x" * (4 * 1024 * 1024 + 1)}]}, "documents[0]"),
        ({"model": MODEL, "documents": [{"text": "x"}], "replicas": 0}, "replicas"),
        ({"model": MODEL, "documents": [{"text": "x"}], "ttl": -1}, "ttl"),
        ({"model": MODEL, "documents": [{"text": "x"}], "wait": "yes"}, "wait"),
    ],
)
async def test_bad_bodies_are_openai_shaped_400s(
    stack_factory: StackFactory, body: dict[str, Any], param: str
) -> None:
    stack = await stack_factory(n=1, max_body_bytes=64 * 1024 * 1024)
    status, doc = await warm(stack.url, body)
    assert (
        status == 400 and doc["error"]["param"] == param and doc["error"]["type"] == "invalid_request_error"
    )
    assert await stack.generations() == []


async def test_keys_and_unknown_models_and_jobs(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, single_model_fallback=False)
    body = {"model": MODEL, "documents": [{"text": "short"}]}
    assert (await warm(stack.url, body, headers={}))[0] == 401  # the admin key is configured: needed
    status, doc = await warm(stack.url, {**body, "model": "nope"})
    assert status == 404 and doc["error"]["code"] == "model_not_found"
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.url + "/v1/warmup/wu_nope", headers=ADMIN) as r:
            assert r.status == 404
        async with s.delete(stack.url + "/v1/warmup/wu_nope", headers=ADMIN) as r:
            assert r.status == 404


async def test_without_a_model_the_only_served_model_is_warmed(stack_factory: StackFactory) -> None:
    one = await stack_factory(n=1)
    status, job = await warm(one.url, {"documents": [{"id": "a", "text": document(1, 200)}], "wait": True})
    assert status == 200 and job["documents"][0]["status"] == "warm"
    two = await stack_factory(models=[MODEL, "other-model"])
    status, doc = await warm(two.url, {"documents": [{"text": "x"}]})
    err = doc["error"]
    assert status == 400 and err["param"] == "model" and f"{MODEL}, other-model" in err["message"]
    assert await two.generations() == []


async def _replica_count(url: str, text: str) -> int:
    """The prompt tokens the replica itself reports for ``text`` (a prefill-only /generate)."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 0}}
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        return int((await r.json())["meta_info"]["prompt_tokens"])


@pytest.mark.parametrize("exact", [False, True])
async def test_a_documents_tokens_are_the_replicas_count(stack_factory: StackFactory, exact: bool) -> None:
    """With ``--tokenizer-path`` the count is exact from the start; without, it is estimated with what
    the router learned, and once warm it is what the replica reported (not 4 characters a token)."""
    hf = ("--emu-tokenizer", "hf", "--model-path", str(BPE)) if exact else ()
    stack = await stack_factory(n=1, emu_flags=hf, **({"tokenizer_path": str(BPE)} if exact else {}))
    texts = [document(5, words=3000), document(7, words=3000)]  # as many bytes per token: 3.34
    counts = [await _replica_count(stack.urls[0], t) for t in texts]
    status, job = await warm(stack.url, {"model": MODEL, "documents": [{"id": "t", "text": texts[0]}]})
    if exact:
        assert status == 202 and job["documents"][0]["tokens"] == counts[0]  # before any step
    await wait_for(lambda: stack.app[WARMUPS].jobs[job["id"]].settled(), 20)
    async with aiohttp.ClientSession() as s, s.get(stack.url + f"/v1/warmup/{job['id']}", headers=ADMIN) as r:
        assert (await r.json())["documents"][0]["tokens"] == counts[0]
    status, job = await warm(stack.url, {"model": MODEL, "documents": [{"id": "u", "text": texts[1]}]})
    assert status == 202 and abs(job["documents"][0]["tokens"] - counts[1]) <= 0.05 * counts[1]


async def test_a_warmed_document_makes_the_first_question_a_hit_on_its_replica(
    stack_factory: StackFactory,
) -> None:
    stack = await stack_factory(n=3, policy="cost")
    docs = [{"id": f"d{i}", "messages": [{"role": "system", "content": document(i)}]} for i in range(3)]
    status, job = await warm(stack.url, {"model": MODEL, "documents": docs, "wait": True})
    assert status == 200 and job["status"] == "done"
    placed = {}
    for d in job["documents"]:
        (rep,) = d["replicas"]
        assert d["status"] == "warm" and rep["status"] == "warm" and d["tokens"] > 2000
        assert rep["now"]["tier"] == "gpu" and rep["now"]["tokens"] >= 0.9 * d["tokens"]
        placed[d["id"]] = rep["replica"]
    assert len(set(placed.values())) == 3  # three documents spread over three replicas by free capacity
    for i in range(3):
        replica, cached = await ask(
            stack.url, [docs[i]["messages"][0], {"role": "user", "content": "first q?"}]
        )
        assert replica == placed[f"d{i}"] and cached > 2000  # the first real question is a hit
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.url + "/v1/warmup", headers=ADMIN) as r:
            listed = (await r.json())["data"]
            assert [j["id"] for j in listed] == [job["id"]] and "content" not in orjson.dumps(listed).decode()
        async with s.delete(stack.url + f"/v1/warmup/{job['id']}", headers=ADMIN) as r:
            assert r.status == 200 and (await r.json())["deleted"] is True


async def test_text_documents_warm_with_generate_and_in_steps(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    jobs = stack.app[__import__("proxy.warm.api", fromlist=["WARMUPS"]).WARMUPS]
    jobs.idle_step_tokens = 1024
    text = document(9, words=4000)
    status, job = await warm(
        stack.url, {"model": MODEL, "documents": [{"id": "t", "text": text}], "wait": True}
    )
    assert status == 200 and job["documents"][0]["status"] == "warm"
    seen = [e for e in await stack.replicas[0].requests("/generate")]
    assert len(seen) >= 4 and all(e["status"] == 200 for e in seen)  # one /generate per step of 1024 tokens
    body = orjson.dumps({"model": MODEL, "prompt": text + " and then", "max_tokens": 2})
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/completions", data=body, headers=JSON) as r,
    ):
        assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] > 3000


async def test_live_traffic_that_starts_mid_document_shrinks_the_remaining_steps(
    stack_factory: StackFactory,
) -> None:
    """Each step is sized when it is sent: a document begun in big (idle) steps goes on in small ones
    once live requests arrive, and no step is sent while a live prefill is queued."""
    stack = await stack_factory(n=1, emu_flags=("--emu-time-scale", "0.2"))
    jobs = stack.app[__import__("proxy.warm.api", fromlist=["WARMUPS"]).WARMUPS]
    jobs.idle_step_tokens, jobs.step_tokens, jobs.quiet_s = 2500, 400, 0.05
    text = document(11, words=8000)
    body = {"model": MODEL, "documents": [{"id": "t", "text": text}], "wait": False}
    status, _ = await warm(stack.url, body)
    assert status in (200, 202)
    await wait_for(lambda: jobs.steps_sent >= 1, 10)  # the first, big step is done: now live traffic
    live = orjson.dumps({"model": MODEL, "prompt": "a live question " * 40, "max_tokens": 2})
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(stack.url + "/v1/completions", data=live, headers=JSON) as r:
                assert r.status == 200
    await wait_for(
        lambda: all(d.placements[0].status == "warm" for j in jobs.jobs.values() for d in j.docs), 30
    )
    steps = [e for e in await stack.replicas[0].requests("/generate")]
    # idle throughout it would take ~4 steps of 2500 tokens; the steps after the live requests are small
    assert len(steps) >= 8, len(steps)


async def test_a_live_request_preempts_the_warm_up_step_running_on_its_replica(
    stack_factory: StackFactory,
) -> None:
    """The step is aborted by its rid (the live request waits for a chunk at most), sent again once
    the replica is quiet, and the document still ends warm."""
    stack = await stack_factory(n=1, emu_flags=("--emu-time-scale", "0.2"))
    jobs = stack.app[__import__("proxy.warm.api", fromlist=["WARMUPS"]).WARMUPS]
    jobs.idle_step_tokens, jobs.idle_step_s, jobs.quiet_s = 100_000, 100.0, 0.05  # one long step
    body = {"model": MODEL, "documents": [{"id": "t", "text": document(12, words=8000)}], "wait": False}
    status, _ = await warm(stack.url, body)
    assert status in (200, 202)
    await wait_for(lambda: bool(jobs._running), 10)  # the long step is running
    live = orjson.dumps({"model": MODEL, "prompt": "a live question " * 40, "max_tokens": 2})
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.url + "/v1/completions", data=live, headers=JSON) as r,
    ):
        assert r.status == 200
    await wait_for(
        lambda: all(d.placements[0].status == "warm" for j in jobs.jobs.values() for d in j.docs), 30
    )
    aborted = (await stack.replicas[0].state())["abort_requests"]["rids"]
    assert jobs.preemptions >= 1 and any(rid.startswith("kvroute-warm-") for rid in aborted)


# an emulator stopped in the middle of the gateway's background scrape of its /metrics can leave that
# one accepted socket to the garbage collector (aiohttp's runner cleanup racing an accept): test harness
# only, the gateway's own connections are closed
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_beyond_the_gpu_a_write_back_replica_keeps_it_in_host_a_hicache_off_one_loses_it(
    stack_factory: StackFactory,
) -> None:
    small = ("--max-total-tokens", "12000")
    back = await stack_factory(n=1, emu_flags=small)
    off = await stack_factory(n=1, emu_flags=(*small, "--hicache-write-policy", "write_back"))
    off_replica = off.replicas[0]
    await off.emulators.stop(off_replica)
    flags = [f for f in EMU_FLAGS if f not in ("--enable-hierarchical-cache",)]
    plain = await off.emulators(*flags, "--served-model-name", MODEL, *small, port=off_replica.port)
    off.replicas[0] = plain
    await wait_for(lambda: off.gw.fleet.get(off.urls[0]).info is not None)  # type: ignore[union-attr]
    await wait_for(lambda: off.gw.fleet.get(off.urls[0]).info.host_tokens == 0)  # type: ignore[union-attr]
    for stack, expect in ((back, "host"), (off, "cold")):
        docs = [{"id": f"d{i}", "messages": [{"role": "system", "content": document(i)}]} for i in range(4)]
        status, job = await warm(stack.url, {"model": MODEL, "documents": docs, "wait": True})
        assert status == 200
        first = job["documents"][0]
        assert first["replicas"][0]["now"]["tier"] == expect  # pushed out of GPU by the three after it
        if expect == "cold":
            assert any("will not survive GPU pressure" in w for w in first["warnings"])
        replica_cached = (await ask(stack.url, [docs[0]["messages"][0], {"role": "user", "content": "q"}]))[1]
        assert (replica_cached > 2000) == (expect == "host")


async def test_a_restarted_replica_is_warmed_again(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1, health_interval=0.1)
    doc = {"id": "d", "messages": [{"role": "system", "content": document(4)}]}
    status, job = await warm(stack.url, {"model": MODEL, "documents": [doc], "ttl": 600, "wait": True})
    assert status == 200
    before = len(await stack.replicas[0].generations())
    await stack.replicas[0].fault(action="restart")  # its cache is gone, its start time changes
    async with aiohttp.ClientSession() as s:

        async def rewarmed() -> bool:
            async with s.get(stack.url + f"/v1/warmup/{job['id']}", headers=ADMIN) as r:
                rep = (await r.json())["documents"][0]["replicas"][0]
            return rep["rewarms"] >= 1 and rep["status"] == "warm" and rep["now"]["tier"] == "gpu"

        await wait_for(rewarmed, timeout_s=15.0)
    assert len(await stack.replicas[0].generations()) > before
    _, cached = await ask(stack.url, [doc["messages"][0], {"role": "user", "content": "after restart?"}])
    assert cached > 2000


async def test_warm_steps_wait_for_live_prefill(stack_factory: StackFactory) -> None:
    """A warm-up step never starts while the replica has live prefill queued."""
    stack = await stack_factory(n=1)
    jobs = stack.app[__import__("proxy.warm.api", fromlist=["WARMUPS"]).WARMUPS]
    fleet = stack.gw.fleet
    started: list[int] = []
    original = jobs._send

    async def spy(step: Any, replica: str) -> bool:
        r = fleet.get(replica)
        assert r is not None
        started.append(len(r.load.queue))
        return await original(step, replica)

    jobs._send = spy  # type: ignore[method-assign]
    await stack.replicas[0].fault(action="slow", factor=30)  # live prefills take a while
    live = [
        asyncio.ensure_future(ask(stack.url, [{"role": "user", "content": f"live {i} " * 50}]))
        for i in range(3)
    ]
    await asyncio.sleep(0.05)
    status, _ = await warm(stack.url, {"model": MODEL, "documents": [{"text": document(1)}], "wait": True})
    await asyncio.gather(*live)
    await stack.replicas[0].fault(action="clear")
    assert status == 200 and started and all(n == 0 for n in started)  # never behind live prefill


async def test_warmed_documents_show_in_status_and_metrics(stack_factory: StackFactory) -> None:
    stack = await stack_factory(n=1)
    doc = {"id": "handbook", "messages": [{"role": "system", "content": document(5)}]}
    status, job = await warm(stack.url, {"model": MODEL, "documents": [doc], "wait": True})
    assert status == 200
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
        section = (await r.json())["warmup"]
    assert section["jobs"] == 1
    (row,) = section["documents"]
    assert (row["job"], row["document"], row["status"]) == (job["id"], "handbook", "warm")
    assert 'kvroute_warmup_documents{state="warm"} 1' in stack.metrics()


async def test_warmed_documents_beyond_a_gpu_pool_are_a_status_warning(stack_factory: StackFactory) -> None:
    """The working set of a replica's model (its warmed documents' tokens) against its GPU pool."""
    stack = await stack_factory(n=1, emu_flags=("--max-total-tokens", "8000"))

    async def warned() -> list[str]:
        async with aiohttp.ClientSession() as s, s.get(stack.url + "/status", headers=ADMIN) as r:
            doc = await r.json()
        assert doc["warmup"]["tokens_per_replica"].get(stack.urls[0], 0) == sum(
            d["tokens"] for j in jobs for d in j["documents"]
        )
        return [w for w in doc["warnings"] if "GPU pool" in w]

    jobs = []
    for i in range(2):  # 5,000 tokens each: the first fits the 8,000-token pool, both do not
        body = {"model": MODEL, "documents": [{"id": f"d{i}", "text": document(i, 2500)}], "wait": True}
        jobs.append((await warm(stack.url, body))[1])
        if i == 0:
            assert await warned() == []
    (warning,) = await warned()
    assert warning.startswith(f"{stack.urls[0]}: the working set of {MODEL} (")
    assert "exceeds its GPU pool (8,000 tokens)" in warning
