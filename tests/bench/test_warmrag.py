"""bench.reports.warmrag and bench.warmrag's pure parts: documents per request, tiers after a warm-up,
first vs repeat TTFT, rates, the PASS/MISS rows; rag_documents are the texts rag asks about."""

from __future__ import annotations

import math

from bench.reports import warmrag as rep
from bench.runs.replay import Record
from bench.warmrag import warm_body
from bench.workloads.generators import RAG_INSTRUCTION, FleetShape, rag, rag_documents, rag_messages
from emulator.timing import PROFILES, ProfileTiming

SHAPE = FleetShape(4, 24_000, 48_000)


def rec(i: int, tag: str, ttft: float | None, prompt: int = 1000, cached: int = 900) -> Record:
    error = "" if ttft is not None else "timeout"
    return Record(i, tag, "s", 200, error, 0.0, 0.0, ttft, ttft, 1.0, prompt, cached, 4, prompt, "r")


def test_rag_documents_are_the_texts_rag_asks_about_and_every_request_maps_to_one() -> None:
    docs = rag_documents(1, SHAPE)
    wl = rag(1, SHAPE, quick=True)
    doc_of = rep.doc_indices(wl.requests, docs)
    assert len(doc_of) == len(wl.requests)
    firsts = {doc_of[r.index] for r in wl.requests if r.tag == "first"}
    assert len(firsts) == sum(1 for r in wl.requests if r.tag == "first")  # one first question per doc


def test_warm_body_documents_start_the_rag_messages_exactly() -> None:
    body = warm_body("m", ["alpha", "beta"], "doc", True)
    assert body["wait"] is True and body["model"] == "m"
    assert [d["id"] for d in body["documents"]] == ["doc-0", "doc-1"]
    later = rag_messages("system", "beta", "Question: why?")
    assert body["documents"][1]["messages"] == later[:1]
    assert later[0]["content"] == RAG_INSTRUCTION + "\n\nbeta"


def test_warm_tiers_read_the_first_placement_now() -> None:
    view = {"documents": [
        {"id": "doc-0", "replicas": [{"replica": "a", "now": {"tier": "gpu"}}]},
        {"id": "doc-1", "replicas": [{"replica": "b", "now": {"tier": "host"}}, {"replica": "c"}]},
        {"id": "doc-2", "replicas": []},
    ]}  # fmt: skip
    assert rep.warm_tiers(view) == {"doc-0": "gpu", "doc-1": "host", "doc-2": "unplaced"}


def test_first_vs_repeat_counts_cold_firsts_and_filters_by_index() -> None:
    records = [rec(0, "first", 2.0), rec(1, "first", 4.0, cached=100), rec(2, "repeat", 1.0),
               rec(3, "repeat", 3.0), rec(4, "first", None)]  # fmt: skip
    every = rep.first_vs_repeat(records)
    assert (every.first_s, every.repeat_s, every.firsts, every.cold) == (3.0, 2.0, 2, 1)
    assert every.ratio == 1.5
    only = rep.first_vs_repeat(records, [0])
    assert (only.firsts, only.cold, only.ratio) == (1, 0, 1.0)
    assert math.isnan(rep.first_vs_repeat([]).ratio)
    assert rep.indices_about({0: 5, 1: 6, 2: 5}, [5]) == [0, 2]


def test_rates_in_modelled_seconds() -> None:
    assert rep.warm_rate(1000.0, 2.0, 0.1) == 50.0  # 2 s wall at 0.1 = 20 modelled s
    timing = ProfileTiming(PROFILES["rtx3090x2"], hicache=True)
    n = 32_768
    assert rep.prefill_rate(timing, 4, n) == 4 * n / timing.prefill_seconds(0, n)


def test_targets_pass_and_miss() -> None:
    found = {
        "first_vs_repeat": {"ratio": 1.1, "cold": 0, "firsts": 9},
        "first_vs_repeat_host": {"ratio": 1.1, "cold": 1, "firsts": 3},
        "without_vs_with": 5.0,
        "throughput": {"ratio": 0.95},
        "live": {"ratio": 1.2},
    }
    got = [r["verdict"] for r in rep.targets(found)]
    assert got == ["PASS", "MISS", "-", "PASS", "MISS"]
    assert "| MISS |" in rep.markdown(found, "cmd", 1.0)


def timed(i: int, due: float, ttft: float) -> Record:
    return Record(i, "repeat", "s", 200, "", due, due, ttft, ttft, 1.0, 100, 90, 4, 100, "r")


def test_by_quarter_matches_requests_by_index_per_quarter_of_the_span() -> None:
    live = [timed(0, 0.0, 2.0), timed(1, 3.0, 1.0), timed(2, 5.0, 1.0), timed(3, 8.0, 3.0)]
    ref = [timed(3, 8.0, 1.0), timed(2, 5.0, 1.0), timed(0, 0.0, 1.0)]  # 1 missing: left out
    got = rep.by_quarter(live, ref)
    assert got[0] == 2.0 and math.isnan(got[1]) and got[2:] == [1.0, 3.0]


def test_ideal_host_over_gpu_is_the_host_reload_cost_over_a_gpu_hit() -> None:
    timing = ProfileTiming(PROFILES["rtx3090x2"], hicache=True)
    got = rep.ideal_host_over_gpu(timing, 6100, 6000)
    gpu = 0.1 + timing.prefill_seconds(6000, 6100)
    assert math.isclose(got, (gpu + 6000 / PROFILES["rtx3090x2"].host_rate) / gpu)
