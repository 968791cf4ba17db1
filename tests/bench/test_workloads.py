"""Workloads are deterministic for a seed, differ across seeds, and have the shapes they claim."""

from __future__ import annotations

import orjson
import pytest

from bench import workloads
from bench.text import WordSource, estimate_tokens
from bench.workloads import CHAT, FleetShape, Workload

SHAPE = FleetShape(replicas=4, gpu_tokens=12_000, host_tokens=24_000)


def _fingerprint(wl: Workload) -> bytes:
    rows = [(r.index, r.arrival_s, r.session, r.path, r.body, r.tag, r.after, r.think_s) for r in wl.requests]
    return orjson.dumps(rows)


@pytest.mark.parametrize("name", list(workloads.GENERATORS))
def test_same_seed_same_stream_other_seed_other_stream(name: str) -> None:
    a = workloads.build(name, 7, SHAPE, quick=True)
    b = workloads.build(name, 7, SHAPE, quick=True)
    c = workloads.build(name, 8, SHAPE, quick=True)
    assert _fingerprint(a) == _fingerprint(b)
    assert _fingerprint(a) != _fingerprint(c)
    assert [r.index for r in a.requests] == list(range(len(a.requests)))
    assert all(r.after is None or r.after < r.index for r in a.requests)


def _rendered_prefix(messages: list[dict[str, object]]) -> str:
    return "".join(f"{m['role']}:{m['content']}\n" for m in messages)


def test_agent_turns_extend_their_own_history() -> None:
    wl = workloads.agent(3, SHAPE, quick=True)
    by_index = {r.index: r for r in wl.requests}
    followers = [r for r in wl.requests if r.after is not None]
    assert followers, "agent turns must follow their previous turn"
    for r in followers:
        prev = by_index[r.after or 0]
        assert prev.session == r.session
        cur_msgs, prev_msgs = list(r.body["messages"]), list(prev.body["messages"])
        assert cur_msgs[: len(prev_msgs)] == prev_msgs
        assert cur_msgs[len(prev_msgs)]["role"] == "assistant"
        assert _rendered_prefix(cur_msgs).startswith(_rendered_prefix(prev_msgs))
        assert r.body["tools"] == prev.body["tools"]
    systems = {r.body["messages"][0]["content"] for r in wl.requests}
    assert len(systems) == 1, "every session shares one system prompt"
    assert len({r.session for r in wl.requests}) > 1


def test_working_sets_exceed_fleet_gpu_but_fit_gpu_plus_host() -> None:
    for name in ("rag", "probe", "mixed"):
        wl = workloads.build(name, 1, SHAPE, quick=False)
        docs: dict[str, int] = {}
        for r in wl.requests:
            key = orjson.dumps(r.body.get("messages") or r.body.get("prompt"))[:4000]
            docs[key.decode()] = max(docs.get(key.decode(), 0), r.expected_prompt_tokens)
        unique = sum(docs.values())
        assert unique > SHAPE.fleet_gpu, name
        assert unique < SHAPE.fleet_total * 1.5, name


def test_probe_phases_resend_the_cold_documents_sequentially() -> None:
    wl = workloads.probe(2, SHAPE)
    tags = [r.tag for r in wl.requests]
    cold = [r for r in wl.requests if r.tag == "cold"]
    for phase in ("resend1", "resend2"):
        again = [r for r in wl.requests if r.tag == phase]
        assert [r.body for r in again] == [r.body for r in cold]
    assert tags.index("pressure") > tags.index("cold")
    assert wl.concurrency == 1
    assert all(r.after == r.index - 1 for r in wl.requests[1:])
    pressure = sum(r.expected_prompt_tokens for r in wl.requests if r.tag in ("cold", "pressure"))
    assert pressure > SHAPE.gpu_tokens + SHAPE.host_tokens


def test_noreuse_prompts_are_unique_and_hot_is_mostly_one_document() -> None:
    wl = workloads.noreuse(5, SHAPE, quick=True)
    prompts = [r.body["prompt"] for r in wl.requests]
    assert len(set(prompts)) == len(prompts)
    hot = workloads.hot(5, SHAPE, quick=True)
    hot_share = sum(r.tag == "hot" for r in hot.requests) / len(hot.requests)
    assert hot_share > 0.6
    assert all(r.path == CHAT for r in hot.requests)


def test_text_lengths_are_measured_in_emulator_tokens() -> None:
    words = WordSource(11)
    doc = words.document("Title", 2000)
    assert 1900 <= estimate_tokens(doc) <= 2100
    assert estimate_tokens("hello world, 12345") == len(["hello", " world", ",", " ", "123", "45"])
