"""The floor (bench.workloads.floor): per request, the emulator's TTFT with every earlier prefix cached and no
queue; and its row and ratio in the report."""

from __future__ import annotations

import pytest

from bench.reports import tables as report
from bench.workloads.floor import FloorRequest, floor
from bench.workloads.generators import FleetShape, probe, rag, rag_tenants
from bench.workloads.tokens import SegmentTokenizer, token_ids
from emulator.model_bpe import make_tokenizer
from emulator.timing import PROFILES, ProfileTiming, ttft_seconds
from tests.conftest import StartEmu

SHAPE = FleetShape(replicas=2, gpu_tokens=6000, host_tokens=12000)
BPE = str(make_tokenizer.HERE)


def test_floor_prefills_first_sends_and_hits_repeats_to_the_last_page() -> None:
    wl = probe(3, SHAPE, quick=True)
    ideal = floor(wl, page_size=16)
    timing = ProfileTiming(PROFILES["rtx3090x2"])
    tok = SegmentTokenizer()
    assert [f.index for f in ideal] == sorted(r.index for r in wl.requests)
    for req, f in zip(sorted(wl.requests, key=lambda r: r.index), ideal, strict=True):
        n = len(token_ids(tok, req.path, dict(req.body)) or [])
        assert f.prompt_tokens == n
        assert f.ttft_s == pytest.approx(f.work_s + timing.overhead_seconds())
        assert f.cold_s == pytest.approx(timing.prefill_seconds(0, n)) and f.work_s <= f.cold_s
        if req.tag in ("cold", "pressure"):  # never seen: a cold prefill, even on the floor
            assert f.cached_tokens < 16
            assert f.ttft_s == pytest.approx(ttft_seconds(timing, n, f.cached_tokens, 0, 0))
        else:  # re-sent: every whole page is cached, the tail shorter than a page is computed
            assert f.cached_tokens == n // 16 * 16
            assert f.ttft_s < 0.2
    cold = next(f for f in ideal if f.cached_tokens < 16)
    assert cold.ttft_s > 3 * max(f.ttft_s for f in ideal if f.cached_tokens >= 16)


def test_report_row_and_ratio_against_the_floor() -> None:
    rows = [
        report.Summary("kvroute-cost", 4, 0, 2.0, 2.0, 3.0, 2.0, 0.5, 1.0, 2, 3.0, 1.0, model_error=0.034),
        report.Summary("client-rr", 4, 0, 4.0, 4.0, 5.0, 4.0, 0.2, 1.0, 2, 3.0, 1.0),
        report.floor_summary([FloorRequest(i, "ab"[i // 2], 25, 15, 1.0, 0.9, 1.2) for i in range(4)]),
    ]
    assert rows[2].hit_ratio == pytest.approx(0.6)
    assert rows[2].by_tag == {"a": 1.0, "b": 1.0}
    md = report.table(rows)
    assert "| floor | 4 | 0 | 1.00 | 1.00 | 1.00 | n/a | 0.600 | n/a | n/a | n/a | n/a |" in md
    line = report.comparison(rows)
    assert "0.50x the best other non-oracle (client-rr 4.00 s)" in line  # the floor is not a system
    assert "mean TTFT 2.00x the floor (1.00 s; the best other non-oracle is 4.00x)" in line
    assert "cache model error 3.4% of prompt tokens" in line


def test_floor_keeps_each_cache_salt_a_namespace_of_its_own() -> None:
    """rag_tenants: a document first asked by one tenant is a cold prefill for the other (its salt is
    another radix root, as in the emulator), so every "first" is cold and every "repeat" a hit; rag's
    floor, without salts, reuses more."""
    shape = FleetShape(replicas=4, gpu_tokens=12_000, host_tokens=24_000)
    wl = rag_tenants(2, shape, quick=True)
    ideal = floor(wl, page_size=16)
    for req, f in zip(wl.requests, ideal, strict=True):
        if req.tag == "first":
            assert f.cached_tokens <= 16, req.index  # at most the salt's shared instruction page
        else:
            assert f.cached_tokens >= 0.9 * f.prompt_tokens, req.index  # the whole document
    plain = floor(rag(2, shape, quick=True), page_size=16)
    assert sum(f.cached_tokens for f in ideal) < sum(f.cached_tokens for f in plain)


async def test_a_fleet_with_a_tokenizer_directory_gets_a_floor_in_its_tokens(
    emulator_server: StartEmu,
) -> None:
    """bench.exact's fleets tokenize with emulator/model_bpe: the floor counts each prompt as such a
    replica reports it (its BPE gives rag ~1.35x the pseudo-tokenizer's tokens)."""
    emu = await emulator_server("--emu-tokenizer", "hf", "--model-path", BPE, "--emu-time-scale", "0.001")
    wl = rag(2, SHAPE, quick=True)
    ideal, pseudo = floor(wl, 16, tokenizer_path=BPE), floor(wl, 16)
    for req, f, p in list(zip(wl.requests, ideal, pseudo, strict=True))[:3]:
        body = {**req.body, "max_tokens": 1, "stream": False}
        async with emu.http.post(emu.url + req.path, json=body) as resp:
            reported = (await resp.json())["usage"]["prompt_tokens"]
        assert f.prompt_tokens == reported and p.prompt_tokens < 0.9 * reported
