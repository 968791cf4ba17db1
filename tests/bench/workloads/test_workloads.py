"""Workloads are deterministic for a seed, differ across seeds, and have the shapes they claim."""

from __future__ import annotations

import re

import orjson
import pytest

from bench.runs import outages
from bench.workloads import floor, load
from bench.workloads import generators as workloads
from bench.workloads.generators import CHAT, FleetShape, Workload
from bench.workloads.text import WordSource, estimate_tokens
from bench.workloads.tokens import SegmentTokenizer
from emulator.tokenizer import PseudoTokenizer, apply_chat_template

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
    for name in ("rag", "rag_user", "probe", "mixed"):
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


def _prompt(req: workloads.TimedRequest) -> str:
    return apply_chat_template(list(req.body["messages"]), add_generation_prompt=True)


def test_rag_layouts_put_the_document_in_the_system_or_the_user_message() -> None:
    """Same seed: the same documents, questions and arrivals; `rag` renders the document inside the
    system turn and the question alone in the user turn, `rag_user` a short system turn and the document
    first in the user turn, then the question. In both, two questions on one document share a prompt
    prefix (in the emulator's tokens) that covers the whole document."""
    sys_wl, user_wl = workloads.rag(4, SHAPE, quick=True), workloads.rag_user(4, SHAPE, quick=True)
    assert [r.arrival_s for r in sys_wl.requests] == [r.arrival_s for r in user_wl.requests]
    assert [r.tag for r in sys_wl.requests] == [r.tag for r in user_wl.requests]
    tok, plain = SegmentTokenizer(), PseudoTokenizer()
    for a, b in zip(sys_wl.requests, user_wl.requests, strict=True):
        (system_a, user_a), (system_b, user_b) = a.body["messages"], b.body["messages"]
        document = system_a["content"].removeprefix(workloads.RAG_INSTRUCTION + "\n\n")
        assert document.startswith("# Document ") and user_a["content"].startswith("Question: ")
        assert system_b["content"] == workloads.RAG_INSTRUCTION
        assert user_b["content"] == "Document:\n" + document + "\n\n" + user_a["content"]
        text = _prompt(b)
        assert text.index(document) < text.index(user_a["content"]) and "<|im_start|>user\nDocument:" in text
        assert tok.encode(text) == plain.encode(text)  # the floor's and oracle's tokenizer is exact
    for wl in (sys_wl, user_wl):
        by_doc: dict[str, list[workloads.TimedRequest]] = {}
        for r in wl.requests:
            title = re.search(r"# Document \d+\n", _prompt(r))
            assert title is not None
            by_doc.setdefault(title.group(), []).append(r)
        pair = next(reqs for reqs in by_doc.values() if len(reqs) > 1)
        first, second = (tok.encode(_prompt(r)) for r in pair[:2])
        shared = next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)
        assert shared >= min(workloads.RAG_DOC_TOKENS, SHAPE.gpu_tokens // 4) * 0.95, wl.name
    assert {r.tag for r in sys_wl.requests} == {"first", "repeat"} and sys_wl.sweep


def _max_tokens(wl: Workload) -> list[int]:
    return [int(r.body["max_tokens"]) for r in wl.requests]


@pytest.mark.parametrize("name", ["agent", "rag", "rag_user", "noreuse", "hot", "mixed"])
def test_output_lengths_are_log_uniform_in_range_and_seeded(name: str) -> None:
    lengths = _max_tokens(workloads.build(name, 3, SHAPE))
    assert min(lengths) >= workloads.OUTPUT_MIN and max(lengths) <= workloads.OUTPUT_MAX
    assert lengths == _max_tokens(workloads.build(name, 3, SHAPE))
    assert lengths != _max_tokens(workloads.build(name, 4, SHAPE))
    lengths.sort()
    assert lengths[len(lengths) // 4] < 90 and lengths[3 * len(lengths) // 4] > 180  # log-uniform quartiles
    assert 100 < lengths[len(lengths) // 2] < 165  # median near sqrt(32 * 512) = 128, mean near 173


def test_the_probe_keeps_its_short_outputs() -> None:
    assert set(_max_tokens(workloads.probe(1, SHAPE))) == {8}


def test_rag_tenants_asks_rag_questions_under_two_salts() -> None:
    """rag's documents, questions and arrivals; each request one tenant's (both present, about half
    each) with its cache_salt and its session naming it; a first question counts per (tenant, doc)."""
    plain, salted = workloads.rag(5, SHAPE, quick=True), workloads.rag_tenants(5, SHAPE, quick=True)
    assert salted.sweep and not salted.outages
    assert [r.arrival_s for r in salted.requests] == [r.arrival_s for r in plain.requests]
    salts = [r.body["cache_salt"] for r in salted.requests]
    assert set(salts) == set(workloads.TENANTS) == {"tenant-a", "tenant-b"}
    assert 0.3 < salts.count("tenant-a") / len(salts) < 0.7
    seen: set[tuple[str, str]] = set()
    for a, b, salt in zip(plain.requests, salted.requests, salts, strict=True):
        assert {k: v for k, v in b.body.items() if k != "cache_salt"} == a.body
        assert b.session == f"rag-{salt}-{a.index}" and b.expected_prompt_tokens == a.expected_prompt_tokens
        key = (salt, b.body["messages"][0]["content"])
        assert b.tag == ("repeat" if key in seen else "first")
        seen.add(key)
    firsts = [r.tag for r in salted.requests].count("first")
    assert firsts > [r.tag for r in plain.requests].count("first")  # a document is new to each tenant


def test_rag_restart_is_rag_with_an_outage_that_follows_the_load_rescaling() -> None:
    """The same requests as rag, and one outage: replica 0, at 40% of the arrival span, down 10 modelled
    seconds. bench.workloads.load.at_load rescales the arrivals, so the outage's time moves with them (a
    fraction of the span from the first arrival) while its down time stays in modelled seconds."""
    plain, wl = workloads.rag(6, SHAPE, quick=True), workloads.rag_restart(6, SHAPE, quick=True)
    assert wl.requests == plain.requests and wl.sweep
    assert wl.outages == (workloads.Outage(at_frac=0.4, replica=0, down_s=10.0),)
    ideal = floor.floor(wl, 16)
    for target in (0.3, 0.9):
        scaled, offered = load.at_load(wl, ideal, target, SHAPE.replicas)
        assert scaled.outages == wl.outages
        times = [r.arrival_s for r in scaled.requests]
        assert offered.span_s == pytest.approx(max(times) - min(times))
        ((at, outage),) = outages.schedule(scaled)
        assert at == pytest.approx(min(times) + 0.4 * (max(times) - min(times)))
        assert outage.down_s == 10.0
    assert outages.describe(wl) == [
        {"at_s": round(outages.schedule(wl)[0][0], 3), "replica": 0, "down_s": 10.0}
    ]
    assert outages.schedule(plain) == [] and outages.injector(plain, ["u"], 0.2) is None
    with pytest.raises(ValueError, match="replica 0"):
        outages.injector(wl, [], 0.2)
