"""Table tests of the emulated radix cache: policies, eviction, load back, locks, storage, hybrid anchors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from emulator.radix import Admission, CacheConfig, RadixCache
from emulator.storage import FileStorage, Storage, chain_hashes


def seq(doc: int, n: int) -> list[int]:
    """A deterministic token sequence; different ``doc`` values share no first token."""
    return [doc * 1000 + (k * 7) % 997 for k in range(n)]


def serve(cache: RadixCache, tokens: Sequence[int], out: int = 0, key: str | None = None) -> Admission:
    """One request: admit (reserving its uncached prompt and output), then finish with prompt + output."""
    m = cache.match(tokens, key)
    adm = cache.admit(tokens, key, len(tokens) - m.total + out)
    assert adm is not None
    cache.finish(adm, [*tokens, *range(1, out + 1)], key)
    return adm


def serve_chunked(
    cache: RadixCache, tokens: Sequence[int], out: int = 0, key: str | None = None, chunk: int = 2048
) -> Admission:
    """One request as the engine runs it: admit, insert the prompt computed after each prefill chunk
    (chunked=True until the last one, which inserts only if the request decodes past its first token),
    then finish with prompt + output."""
    m = cache.match(tokens, key)
    adm = cache.admit(tokens, key, len(tokens) - m.total + out)
    assert adm is not None
    pos = min(adm.cached_tokens, len(tokens) - 1)
    while pos < len(tokens):
        pos = min(pos + chunk, len(tokens))
        if pos < len(tokens) or out > 1:
            cache.insert_unfinished(adm, tokens[:pos], key, chunked=pos < len(tokens))
    cache.finish(adm, [*tokens, *range(1, out + 1)], key)
    return adm


def cache(gpu: int = 64, **kw: object) -> RadixCache:
    return RadixCache(CacheConfig(gpu_tokens=gpu, **kw))  # type: ignore[arg-type]


def test_page_alignment_and_last_token_is_computed() -> None:
    c = cache(page_size=4)
    serve(c, seq(1, 10))
    assert c.stats().gpu_cached == 8  # the partial last page is dropped
    assert c.match(seq(1, 10)).gpu_tokens == 8  # (10 - 1) // 4 pages
    assert c.match(seq(1, 9)).gpu_tokens == 8
    assert c.match(seq(1, 8)).gpu_tokens == 4  # never the whole prompt: one token is always computed
    assert c.match([*seq(1, 5), 9, 9, 9, 9, 9]).gpu_tokens == 4  # a page that differs anywhere is a miss
    c1 = cache(page_size=1)
    serve(c1, seq(1, 10))
    assert serve(c1, seq(1, 10)).cached_tokens == 9


def test_partial_node_match_splits_on_admit() -> None:
    c = cache()
    serve(c, seq(1, 20))
    other = [*seq(1, 12), 5, 5, 5, 5]
    adm = serve(c, other)
    assert adm.cached_tokens == 12
    assert c.match(seq(1, 21)).gpu_tokens == 20 and c.match([*other, 0]).gpu_tokens == 16
    assert c.stats().gpu_cached == 24  # 20 + the 4 new tokens


def test_extra_key_namespaces_never_share() -> None:
    c = cache()
    serve(c, seq(1, 10), key="tenant-a")
    assert c.match(seq(1, 10), "tenant-a").gpu_tokens == 9
    assert c.match(seq(1, 10), "tenant-b").gpu_tokens == 0
    assert c.match(seq(1, 10), None).gpu_tokens == 0


def test_without_hicache_eviction_deletes() -> None:
    c = cache(gpu=32)
    serve(c, seq(1, 20))
    serve(c, seq(2, 20))
    s = c.stats()
    assert c.match(seq(1, 20)).total == 0 and c.match(seq(2, 20)).gpu_tokens == 19
    assert (s.gpu_cached, s.host_used, s.evicted_tokens_total) == (20, 0, 20)


def test_write_back_demotes_and_loads_back() -> None:
    c = cache(gpu=32, hicache=True, host_tokens=64, write_policy="write_back")
    serve(c, seq(1, 20))
    assert c.stats().host_used == 0  # never backed up proactively
    serve(c, seq(2, 20))
    assert c.match(seq(1, 20)) == c.match(seq(1, 20)).__class__(0, 19, 0)
    s = c.stats()
    assert (s.host_used, s.backuped_tokens_total, s.evicted_tokens_total) == (20, 20, 20)
    adm = serve(c, seq(1, 20))
    assert (adm.gpu_hit_tokens, adm.host_loaded_tokens, adm.cached_tokens) == (0, 19, 19)
    s = c.stats()
    assert s.load_back_tokens_total == 19 and s.host_hit_tokens_total == 19
    assert c.match(seq(1, 20)).gpu_tokens == 19
    assert c.match(seq(2, 20)).host_tokens == 19  # seq 2 was demoted to make room for the load


def test_write_through_backs_up_on_insert_and_eviction_keeps_host_copy() -> None:
    c = cache(gpu=32, hicache=True, host_tokens=64, write_policy="write_through")
    serve(c, seq(1, 20))
    assert c.stats().host_used == 20 and c.stats().backuped_tokens_total == 20
    serve(c, seq(2, 20))
    s = c.stats()
    assert (s.host_used, s.backuped_tokens_total) == (40, 40)  # eviction copied nothing more
    assert c.match(seq(1, 20)).host_tokens == 19


def test_write_through_selective_backs_up_on_second_hit() -> None:
    c = cache(gpu=64, hicache=True, host_tokens=128, write_policy="write_through_selective")
    serve(c, seq(1, 20))
    assert c.stats().host_used == 0
    serve(c, seq(1, 20))
    assert c.stats().host_used == 20


def test_write_through_backup_fails_when_host_is_full_and_node_is_then_deleted() -> None:
    c = cache(gpu=32, hicache=True, host_tokens=16, write_policy="write_through")
    serve(c, seq(1, 20))
    assert c.stats().host_used == 0  # no room: the node stays GPU-only
    serve(c, seq(2, 20))
    assert c.match(seq(1, 20)).total == 0


def test_host_overflow_evicts_host_only_leaves_lru() -> None:
    c = cache(gpu=24, hicache=True, host_tokens=48, write_policy="write_back")
    for d in (1, 2, 3, 4):
        serve(c, seq(d, 20))
    # seq 4 on GPU; 1, 2, 3 demoted in that order; the host holds two of them: 1 (LRU) went first
    assert [c.match(seq(d, 20)).total for d in (1, 2, 3, 4)] == [0, 19, 19, 19]
    assert c.stats().host_used == 40


def test_short_host_hits_are_recomputed() -> None:
    c = cache(gpu=16, hicache=True, host_tokens=64, write_policy="write_back", load_back_threshold=10)
    serve(c, seq(1, 8))
    serve(c, seq(2, 16))
    assert c.match(seq(1, 8)).host_tokens == 0  # 7 tokens < 10: not worth a load
    adm = serve(c, seq(1, 8))
    assert adm.cached_tokens == 0 and c.match(seq(1, 8)).gpu_tokens == 7  # recomputed, back on GPU


def test_locked_path_is_never_evicted_and_admit_waits() -> None:
    c = cache(gpu=32)
    a = c.admit(seq(1, 20), None, 20)
    assert a is not None
    assert c.admit(seq(2, 20), None, 20) is None  # 20 reserved + 20 more does not fit in 32
    assert not c.extend(a, 13)
    assert c.extend(a, 12)
    c.finish(a, seq(1, 20), None)
    held = c.admit(seq(1, 21), None, 1)
    assert held is not None and held.cached_tokens == 20
    assert c.admit(seq(2, 20), None, 20) is None  # seq 1 is locked by `held`
    c.abort(held)
    assert c.admit(seq(2, 20), None, 20) is not None
    assert c.match(seq(1, 20)).total == 0


def test_reservation_counts_in_gpu_used_and_is_released() -> None:
    c = cache(gpu=64, page_size=4)
    a = c.admit(seq(1, 10), None, 13)
    assert a is not None and c.stats().gpu_used == 16
    c.finish(a, seq(1, 13), None)
    s = c.stats()
    assert (s.gpu_used, s.gpu_cached, s.gpu_evictable) == (12, 12, 12)
    c.finish(a, seq(1, 13), None)  # a second finish is ignored
    assert c.stats().gpu_used == 12


def test_unfinished_prefix_is_matchable_and_moves_out_of_the_reservation() -> None:
    c = cache(gpu=64, page_size=4)
    a = c.admit(seq(1, 22), None, 22 + 4)  # 26 tokens reserved: 7 pages
    assert a is not None and c.stats().gpu_used == 28
    assert c.insert_unfinished(a, seq(1, 10), None, chunked=True) == 8  # whole pages only
    s = c.stats()
    assert (s.gpu_used, s.gpu_cached, s.gpu_evictable) == (28, 8, 0)  # moved, not added; locked by `a`
    assert c.match(seq(1, 30)).gpu_tokens == 8
    assert c.insert_unfinished(a, seq(1, 22), None, chunked=False) == 20
    assert c.insert_unfinished(a, seq(1, 9), None, chunked=False) == 20  # nothing new: a no-op
    s = c.stats()
    assert (s.gpu_used, s.gpu_cached, s.gpu_evictable) == (28, 20, 0)
    b = c.admit(seq(1, 30), None, 10)  # admitted while `a` still runs: a GPU hit on a's prompt
    assert b is not None and (b.gpu_hit_tokens, b.cached_tokens) == (20, 20)
    c.finish(a, [*seq(1, 22), 1, 2, 3, 4], None)  # only the remainder [20, 24) is new
    s = c.stats()
    assert (s.gpu_cached, s.gpu_evictable, s.gpu_used) == (24, 4, 24 + 12)  # b keeps [0, 20) locked


def test_concurrent_duplicates_are_not_counted_twice() -> None:
    c = cache(gpu=64)
    a, b = c.admit(seq(1, 20), None, 24), c.admit(seq(1, 20), None, 24)  # both miss: both compute it
    assert a is not None and b is not None and c.stats().gpu_used == 48
    c.insert_unfinished(a, seq(1, 20), None, chunked=False)
    c.insert_unfinished(b, seq(1, 20), None, chunked=False)  # b's copy is a duplicate: freed
    s = c.stats()
    assert (s.gpu_cached, s.gpu_used) == (20, 20 + 4 + 4)
    c.finish(a, seq(1, 24), None)
    c.finish(b, seq(1, 24), None)
    s = c.stats()
    assert (s.gpu_cached, s.gpu_used, s.gpu_evictable) == (24, 24, 24)


def test_abort_keeps_the_inserted_prefix_cached_and_unlocked() -> None:
    c = cache(gpu=32)
    a = c.admit(seq(1, 20), None, 20)
    assert a is not None
    c.insert_unfinished(a, seq(1, 12), None, chunked=True)
    c.abort(a)
    s = c.stats()
    assert (s.gpu_used, s.gpu_cached, s.gpu_evictable) == (12, 12, 12)
    assert c.match(seq(1, 20)).gpu_tokens == 12
    assert c.insert_unfinished(a, seq(1, 20), None, chunked=False) == 0  # released: ignored
    assert c.stats().gpu_cached == 12


def test_unfinished_inserts_count_hits_only_when_not_chunked() -> None:
    wt = cache(gpu=64, hicache=True, host_tokens=128, write_policy="write_through")
    a = wt.admit(seq(1, 20), None, 24)
    assert a is not None
    wt.insert_unfinished(a, seq(1, 12), None, chunked=True)
    assert wt.stats().host_used == 0  # an intermediate chunk's insert counts no hit
    wt.insert_unfinished(a, seq(1, 20), None, chunked=False)
    assert wt.stats().host_used == 20  # the whole path counts: backed up while the request decodes
    sel = cache(gpu=64, hicache=True, host_tokens=128, write_policy="write_through_selective")
    serve_chunked(sel, seq(1, 20), chunk=8)  # ends at its first token: chunked inserts, then finish
    assert sel.stats().host_used == 0
    b = sel.admit(seq(2, 20), None, 24)
    assert b is not None
    sel.insert_unfinished(b, seq(2, 20), None, chunked=False)
    assert sel.stats().host_used == 0  # one hit
    sel.finish(b, seq(2, 24), None)
    assert sel.stats().host_used == 20  # the second: SGLang 0.5.10 counts both inserts of one request


def test_flush_refuses_while_locked_and_keeps_storage() -> None:
    store = Storage(1000)
    c = cache(hicache=True, host_tokens=128, storage=store, prefetch_threshold=8)
    serve(c, seq(1, 20))
    a = c.admit(seq(1, 20), None, 1)
    assert a is not None
    assert not c.flush()
    c.abort(a)
    assert c.flush()
    s = c.stats()
    assert (s.gpu_cached, s.host_used, s.storage_used) == (0, 0, 20)
    assert c.match(seq(1, 20)) == c.match(seq(1, 20)).__class__(0, 0, 19)


def test_restart_keeps_storage_and_prefetches_it() -> None:
    store = Storage(1000)
    c = cache(hicache=True, host_tokens=128, storage=store, prefetch_threshold=16)
    serve(c, seq(1, 40))
    c.restart()
    assert c.stats().gpu_cached == 0
    assert c.match(seq(1, 40)).storage_tokens == 39
    assert c.match(seq(1, 12)).storage_tokens == 0  # below prefetch_threshold
    adm = serve(c, seq(1, 40))
    assert (adm.storage_loaded_tokens, adm.cached_tokens) == (39, 39)
    assert c.stats().prefetched_tokens_total == 39
    assert c.match(seq(1, 40)).gpu_tokens == 39


def test_stale_admission_after_restart_is_ignored() -> None:
    c = cache()
    a = c.admit(seq(1, 10), None, 10)
    assert a is not None
    c.restart()
    c.finish(a, seq(1, 10), None)
    assert c.stats().gpu_used == 0 and c.match(seq(1, 10)).total == 0
    assert not c.extend(a, 1)


def test_storage_is_namespaced_and_lru(tmp_path: Path) -> None:
    a = list(chain_hashes(b"", seq(1, 8), 4, None))
    assert a != list(chain_hashes(b"", seq(1, 8), 4, "t"))
    store = Storage(8)
    store.put(a, 4)
    store.put(list(chain_hashes(b"", seq(2, 4), 4, None)), 4)
    assert store.used_tokens == 8 and a[0] not in store and a[1] in store
    assert store.longest_prefix(a) == 0


def test_file_storage_survives_a_new_instance(tmp_path: Path) -> None:
    cfg = {"gpu_tokens": 64, "hicache": True, "host_tokens": 128, "prefetch_threshold": 16}
    first = RadixCache(CacheConfig(storage=FileStorage(tmp_path, 1000), **cfg))  # type: ignore[arg-type]
    serve(first, seq(1, 40))
    again = RadixCache(CacheConfig(storage=FileStorage(tmp_path, 1000), **cfg))  # type: ignore[arg-type]
    assert again.match(seq(1, 40)).storage_tokens == 39
    small = FileStorage(tmp_path, 10)  # capacity shrank: LRU pages beyond it go
    assert small.used_tokens == 10
    assert len(FileStorage(tmp_path, 1000)) == 10


def test_snapshot_reports_leaves_per_tier() -> None:
    c = cache(gpu=32, hicache=True, host_tokens=64, write_policy="write_back")
    serve(c, seq(1, 20))
    serve(c, seq(2, 20))
    snap = c.snapshot()
    assert (snap["gpu_pages"], snap["host_pages"]) == (20, 20)
    leaves = snap["leaves"]
    assert isinstance(leaves, list)
    assert sorted((depth, tier) for _, depth, tier in leaves) == [(20, "gpu"), (20, "host")]


HYBRID = {
    "gpu_tokens": 160_000,
    "hicache": True,
    "host_tokens": 320_000,
    "hybrid": True,
    "mamba_slots": 15,
    "host_mamba_slots": 30,
    "mamba_extra_buffer": True,
    "mamba_track_interval": 256,
}


@pytest.mark.parametrize("run", [serve, serve_chunked])
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_hybrid_seed_probe(policy: str, run: Callable[..., Admission]) -> None:
    """The seeds' probe: cold 40K doc R, ten other 40K docs of pressure, then re-send R; with and without
    the running requests' inserts after each prefill chunk."""
    c = RadixCache(CacheConfig(write_policy=policy, **HYBRID))  # type: ignore[arg-type]
    doc_r = seq(100, 40_000)
    assert run(c, doc_r, out=16).cached_tokens == 0
    for d in range(1, 11):
        run(c, seq(100 + d, 40_000), out=16)
    s = c.stats()
    resend = run(c, doc_r, out=16)
    again = run(c, doc_r, out=16)
    assert again.gpu_hit_tokens >= 39_000  # the device path works in both modes
    if policy == "write_back":
        assert resend.host_loaded_tokens >= 39_000 and resend.gpu_hit_tokens == 0
        assert s.host_used < s.host_capacity
    else:
        assert resend.cached_tokens == 0  # host KV is there, but without a recurrent-state anchor
        assert s.host_used >= 0.9 * s.host_capacity
        assert s.mamba_host_used == 30


def test_hybrid_running_requests_need_a_slot() -> None:
    c = cache(gpu=256, hybrid=True, mamba_slots=1)
    a = c.admit(seq(1, 20), None, 20)
    assert a is not None and c.stats().mamba_used == 1
    assert c.admit(seq(2, 20), None, 20) is None  # the only slot runs `a`
    c.finish(a, seq(1, 20), None)
    assert c.stats().mamba_used == 1  # now an anchor of the cached prefix
    b = c.admit(seq(2, 20), None, 20)  # the anchor is evicted (a GPU leaf: the whole node goes)
    assert b is not None and c.match(seq(1, 20)).total == 0


def test_hybrid_match_stops_at_the_deepest_anchor() -> None:
    c = cache(gpu=256, hybrid=True, mamba_slots=4)
    serve(c, seq(1, 20))
    assert c.match(seq(1, 30)).gpu_tokens == 20
    assert c.match([*seq(1, 12), 0, 0]).total == 0  # inside the anchored node: no state there


def test_hybrid_unfinished_insert_anchors_and_moves_the_pin() -> None:
    c = cache(gpu=256, hybrid=True, mamba_slots=2)
    a = c.admit(seq(1, 20), None, 20)  # a running slot
    assert a is not None
    c.insert_unfinished(a, seq(1, 12), None, chunked=True)  # an anchor at 12: the second slot
    assert c.match(seq(1, 30)).gpu_tokens == 12 and c.stats().mamba_used == 2
    assert c.admit(seq(2, 20), None, 20) is None  # the only cached anchor is pinned by `a`
    c.finish(a, seq(1, 20), None)
    assert c.match(seq(1, 30)).gpu_tokens == 20
    assert c.admit(seq(2, 20), None, 20) is not None  # unpinned now: the LRU anchor goes
