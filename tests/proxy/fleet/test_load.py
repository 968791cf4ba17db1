"""proxy/fleet/load.py: a replica's load in work, and the start-up bias correction of its decaying
averages."""

from __future__ import annotations

import math

import pytest

from proxy.fleet.load import MIN_ELAPSED_S, DecayingRate, LoadView, ReplicaLoad, TrafficEpoch, Work, combined

WINDOW = 10.0


def work(
    sent: float, work_s: float = 1.0, *, streamed: bool = True, live: bool = True, overhead: float = 0.0
) -> Work:
    return Work(
        sent,
        prefill_tokens=1000,
        work_s=work_s,
        ttft_s=work_s + overhead,
        budget=64,
        streamed=streamed,
        live=live,
        overhead_s=overhead,
    )


def load(epoch: TrafficEpoch | None = None) -> ReplicaLoad:
    return ReplicaLoad(WINDOW, epoch or TrafficEpoch())


def test_queued_work_counts_until_the_first_byte_and_decoding_holds_no_prefill() -> None:
    r = load()
    a, b = work(0.0, 2.0), work(0.0, 3.0)
    r.add(a)
    r.add(b)
    assert r.view(0.0, 0).inflight_prefill_s == pytest.approx(5.0)
    r.first_token(a, 2.0)
    v = r.view(2.0, 0)
    assert v.inflight_requests == 2  # a decodes, b is queued
    assert v.inflight_prefill_s == pytest.approx(3.0)  # only b's work; the head started at a's first byte
    assert r.view(3.0, 0).inflight_prefill_s == pytest.approx(2.0)  # b's head has run for 1 s
    r.release(a, 4.0)
    r.release(b, 4.0)
    assert r.view(4.0, 0) == LoadView(0, 0, 0.0, (), r.view(4.0, 0).arrival_rate, r.view(4.0, 0).utilization)


def test_an_unstreamed_answer_counts_as_decoding_once_its_predicted_ttft_has_passed() -> None:
    r = load()
    r.add(work(0.0, 2.0, streamed=False))
    assert r.view(1.0, 0).inflight_prefill_s == pytest.approx(1.0)
    assert r.view(2.5, 0).inflight_prefill_s == 0.0
    assert r.view(2.5, 0).inflight_requests == 1


def test_decoding_detail_only_when_the_running_slots_or_half_the_pool_are_full() -> None:
    r = load()
    a = work(0.0, 1.0)
    a.kv_tokens = 1064
    r.add(a)
    r.first_token(a, 1.0)
    assert r.view(3.0, 2).decoding == ()
    assert r.view(3.0, 1).decoding == ((2.0, 64, 1064),)
    assert r.view(3.0, 2, pool_tokens=2200).decoding == ()
    assert r.view(3.0, 2, pool_tokens=2128).decoding == ((2.0, 64, 1064),)


def test_held_kv_counts_queued_and_decoding_requests_until_released_once() -> None:
    r = load()
    a, b = work(0.0), work(0.0)
    a.kv_tokens, b.kv_tokens = 1064, 500
    r.add(a)
    r.add(b)
    r.first_token(a, 1.0)
    assert r.view(1.5, 0).kv_tokens == 1564
    r.release(a, 2.0)
    r.release(a, 2.5)  # a second release takes nothing more
    assert r.view(3.0, 0).kv_tokens == 500
    r.release(b, 3.0)
    assert r.view(3.0, 0).kv_tokens == 0


def test_arrival_rate_is_not_underestimated_while_traffic_is_young() -> None:
    """A steady 2 requests/s read 3 s after traffic began: a zero-started decaying average reads
    2 x (1 - e^-0.3) = 0.52/s; corrected it reads 2/s (within the discreteness of the arrivals)."""
    r = load()
    for i in range(7):
        r.add(work(i * 0.5, 0.01))
    raw = DecayingRate(WINDOW)
    for i in range(7):
        raw.add(1.0, i * 0.5)
    assert raw.at(3.0) < 0.8
    assert r.view(3.0, 0).arrival_rate == pytest.approx(2.0, rel=0.2)


def test_long_running_traffic_is_left_as_it_is() -> None:
    epoch = TrafficEpoch(first_live_s=0.0)
    assert epoch.correction(100 * WINDOW, WINDOW) == pytest.approx(1.0)
    assert epoch.correction(WINDOW, WINDOW) == pytest.approx(1 / (1 - math.exp(-1)))


def test_the_correction_treats_traffic_as_at_least_min_elapsed_old() -> None:
    epoch = TrafficEpoch()
    assert epoch.correction(5.0, WINDOW) == 1.0  # no traffic yet
    epoch.started(5.0)
    epoch.started(6.0)  # the first live request fixes the epoch
    assert epoch.first_live_s == 5.0
    assert epoch.correction(5.0, WINDOW) == pytest.approx(1 / -math.expm1(-MIN_ELAPSED_S / WINDOW))


def test_a_replica_that_got_nothing_reads_zero_and_shares_the_fleets_epoch() -> None:
    epoch = TrafficEpoch()
    busy, idle = load(epoch), load(epoch)
    for i in range(10):
        busy.add(work(float(i), 0.1))
    assert idle.view(10.0, 0).arrival_rate == 0.0
    assert idle.view(10.0, 0).utilization == 0.0
    assert epoch.first_live_s == 0.0
    assert busy.view(10.0, 0).arrival_rate == pytest.approx(1.0, rel=0.25)


def test_warm_up_steps_do_not_start_the_traffic_epoch_or_count_as_arrivals() -> None:
    r = load()
    r.add(work(0.0, 1.0, live=False))
    assert r.epoch.first_live_s is None
    assert r.view(0.5, 0).arrival_rate == 0.0
    assert r.view(0.5, 0).inflight_prefill_s == pytest.approx(0.5)


def test_utilization_of_a_replica_busy_since_traffic_began_reads_near_one_and_never_above() -> None:
    r = load()
    r.add(work(0.0, 100.0))
    assert r.view(3.0, 0).utilization == pytest.approx(1.0, abs=0.2)
    assert r.view(50.0, 0).utilization <= 1.0


def _fcfs(r: ReplicaLoad, every: float, prefill: float, overhead: float, until: float) -> None:
    """A request every `every` s; an FCFS engine serves each `prefill` s, its first byte `overhead` s
    after its prefill ends (the overhead runs beside the next prefill). Events in time order."""
    events, engine_free = [], 0.0
    for i in range(int(until / every)):
        sent, w = i * every, work(i * every, prefill, overhead=overhead)
        engine_free = max(sent, engine_free) + prefill
        events += [(sent, 0, w), (engine_free + overhead, 1, w)]
    for t, kind, w in sorted((e for e in events if e[0] <= until), key=lambda e: (e[0], e[1])):
        r.add(w) if kind == 0 else r.first_token(w, t)


@pytest.mark.parametrize(
    ("prefill", "expected"),
    [
        (
            0.05,
            0.5,
        ),  # answers overlap (each outstanding 0.55 s, one sent every 0.1 s): the engine is half idle
        (0.02, 0.2),
        (0.2, 1.0),  # the engine never catches up
    ],
)
def test_utilization_is_the_engine_s_service_not_the_time_with_a_request_outstanding(
    prefill: float, expected: float
) -> None:
    r = load()
    _fcfs(r, every=0.1, prefill=prefill, overhead=0.5, until=40.0)
    assert r.view(40.0, 0).utilization == pytest.approx(expected, abs=0.05)


def test_combined_views_add_work_and_rates_and_take_the_largest_busy_fraction() -> None:
    """Busy periods of gateways sharing a replica nest (proxy.fleet.load.combined): their union is close to
    the largest, not what independent periods would give (0.75 here)."""
    a = LoadView(1, 100, 1.0, ((1.0, 8, 0),), 2.0, 0.5)
    b = LoadView(2, 200, 2.0, (), 1.0, 0.6)
    c = combined(a, b)
    assert (c.inflight_requests, c.inflight_prefill_tokens, c.inflight_prefill_s) == (3, 300, 3.0)
    assert c.decoding == a.decoding
    assert c.arrival_rate == 3.0
    assert c.utilization == pytest.approx(0.6)
    assert combined(b, LoadView(0, 0, 0.0, (), 0.0, 1.7)).utilization == 1.0


def test_queued_prefill_is_priced_at_the_current_rate_when_one_is_given() -> None:
    """Routed at a start rate of 1 ms a token (1 s each), learned since at 0.2 ms: 0.2 s each, and the
    head's elapsed service is capped at its repriced work; reloads keep their predicted seconds."""
    r = load()
    a, b = work(0.0, 1.0), work(0.0, 1.5)
    b.reload_s = 0.5  # b: 1000 tokens (1 s at the start rate) + a 0.5 s reload
    r.add(a)
    r.add(b)
    assert r.view(0.0, 0).inflight_prefill_s == pytest.approx(2.5)  # as routed
    assert r.view(0.0, 0, 0.0002).inflight_prefill_s == pytest.approx(0.2 + 0.2 + 0.5)
    assert r.view(0.1, 0, 0.0002).inflight_prefill_s == pytest.approx(0.1 + 0.2 + 0.5)  # a half done
    assert r.view(5.0, 0, 0.0002).inflight_prefill_s == pytest.approx(0.7)  # a overdue: b's work stays
    r.first_token(a, 5.0)
    assert r.view(5.0, 0, 0.0002).inflight_prefill_s == pytest.approx(0.7)


def test_a_running_requests_output_budget_counts_at_the_replicas_ratio() -> None:
    """SGLang charges a running request new_token_ratio x its output budget; a queued one is charged
    the whole budget when it is admitted."""
    r = load()
    a = work(0.0)
    a.kv_tokens = 1064  # 1000 uncached + a 64-token budget
    r.add(a)
    assert r.view(0.5, 0, reserve=0.25).kv_tokens == 1064
    r.first_token(a, 1.0)
    assert r.view(1.5, 0, reserve=0.25).kv_tokens == 1000 + 16
    assert r.view(1.5, 1, reserve=0.25).decoding == ((0.5, 64, 1016),)
    assert r.view(1.5, 0).kv_tokens == 1064
    r.release(a, 2.0)
    assert (r.kv_tokens, r.running_output) == (0, 0)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (1.0, 4.0),  # both queued, head served for 1 s of its 2: 2 + 3 - 1 (its deadline is 4 s away)
        (4.9, 3.0),  # the head served at most its own 2 s; not yet past its deadline
        (6.0, 6.0),  # head past its 5 s deadline: its wait so far (6 s) is more than the 3 s modelled
        (20.0, 20.0),
    ],
)
def test_a_head_past_its_first_byte_deadline_sets_the_queue_by_its_wait(now: float, expected: float) -> None:
    r = load()
    head, behind = work(0.0, 2.0), work(0.5, 3.0)
    head.first_byte_s = behind.first_byte_s = 5.0
    r.add(head)
    r.add(behind)
    assert r.view(now, 0).inflight_prefill_s == pytest.approx(expected)


def test_only_the_head_of_the_queue_counts_as_overdue_and_not_once_it_started() -> None:
    r = load()
    head, behind = work(0.0, 1.0), work(0.0, 1.0)
    head.first_byte_s, behind.first_byte_s = 100.0, 2.0
    r.add(head)
    r.add(behind)
    assert r.view(10.0, 0).inflight_prefill_s == pytest.approx(1.0)  # 2 s of work, the head's 1 s done
    r.first_token(head, 10.0)
    assert r.view(11.0, 0).inflight_prefill_s == pytest.approx(11.0)  # now the head, and 9 s overdue


def test_a_first_byte_overtakes_the_overdue_streamed_requests_sent_well_before_it() -> None:
    r = load()
    early, unstreamed, close, soon, later, last = (
        work(0.0),
        work(0.0, streamed=False),  # waits for a whole answer: being overtaken is normal
        work(0.25),  # within OVERTAKE_MARGIN_S of ``later``: a race on the wire
        work(0.3),
        work(0.3),
        work(0.5),
    )
    for w in (early, unstreamed, close, soon, later, last):
        w.first_byte_s = 0.5  # past it from 0.5 s after its send
        r.add(w)
    r.first_token(soon, 0.45)  # early is not overdue yet: it may still be on its way in
    assert early.overtaken == 0
    r.first_token(later, 1.0)
    assert (early.overtaken, unstreamed.overtaken, close.overtaken, last.overtaken) == (1, 0, 0, 0)
    whole = work(0.4, streamed=False)
    whole.first_byte_s = 0.5
    r.add(whole)
    r.first_token(whole, 1.05)  # a whole answer (or its promotion) is no first byte: it overtakes nobody
    assert early.overtaken == 1
    r.first_token(early, 1.1)  # the head of the queue overtakes nobody
    r.first_token(last, 1.2)
    assert (early.overtaken, unstreamed.overtaken, close.overtaken) == (1, 0, 1)
    r.release(unstreamed, 1.3)
    r.first_token(work(2.0), 2.0)  # not in the queue: nothing counts
    assert close.overtaken == 1
