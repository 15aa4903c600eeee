"""The degradation signals: windows over timestamped samples, the engines'
counters turned into increments (restarts included), and the four signal
values computed from scrape rounds and outcomes, on a fake clock."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig, ReplicaConfig
from gateway.degrade.counters import CounterDeltas, Increments
from gateway.degrade.signals import ERROR_RATE, KV_USE, MIN_OUTCOMES, PREEMPTIONS, QUEUE_TIME, Signals
from gateway.degrade.window import SignalWindow
from gateway.fleet.load import LoadReading, parse_load
from gateway.fleet.replica import Replica

EXPOSITION = """# TYPE llm_num_requests_waiting gauge
llm_num_requests_waiting{model="python_llm",version="1"} 3
# TYPE llm_kv_cache_blocks_used gauge
llm_kv_cache_blocks_used{model="python_llm",version="1"} 40
# TYPE llm_kv_cache_blocks_capacity gauge
llm_kv_cache_blocks_capacity{model="python_llm",version="1"} 160
# TYPE llm_preemptions_total counter
llm_preemptions_total{model="python_llm",version="1"} 7
# TYPE llm_request_queue_time_seconds histogram
llm_request_queue_time_seconds_bucket{model="python_llm",version="1",le="1"} 2
llm_request_queue_time_seconds_bucket{model="python_llm",version="1",le="+Inf"} 4
llm_request_queue_time_seconds_sum{model="python_llm",version="1"} 12.5
llm_request_queue_time_seconds_count{model="python_llm",version="1"} 4
"""


def test_parse_load_reads_the_engines_counters_and_histogram_totals():
    reading = parse_load(EXPOSITION, at=5.0)
    assert (reading.preemptions, reading.queue_time_sum, reading.queue_time_count) == (7, 12.5, 4)
    assert (reading.waiting, reading.kv_utilisation, reading.at) == (3, 0.25, 5.0)
    # an engine without the counters still gives its gauges (counters 0)
    gauges_only = parse_load(EXPOSITION.split("# TYPE llm_preemptions_total")[0], at=1.0)
    assert gauges_only.preemptions == 0 and gauges_only.kv_used == 40
    with pytest.raises(ValueError):
        parse_load(EXPOSITION.split("# TYPE llm_num_requests_waiting gauge\n")[0] + "# nothing\n", at=1.0)


def test_a_window_forgets_samples_one_span_after_they_came():
    window = SignalWindow(10.0)
    assert window.mean(0.0) is None and window.total(0.0) == 0.0
    window.add(0.0, 4.0)
    window.add(5.0, 2.0)
    assert window.mean(9.9) == 3.0 and window.total(9.9) == 6.0
    assert window.mean(10.0) == 2.0 and window.count(10.0) == 1  # the first one is exactly one span old
    assert window.mean(15.0) is None
    with pytest.raises(ValueError, match="positive"):
        SignalWindow(0)


def reading(at: float, preemptions: float = 0, qsum: float = 0, qcount: float = 0) -> LoadReading:
    return LoadReading(preemptions=preemptions, queue_time_sum=qsum, queue_time_count=qcount, at=at)


def test_counter_increments_start_from_a_baseline_and_survive_a_restart():
    deltas = CounterDeltas()
    assert deltas.advance("a", reading(1, 100, 50.0, 10)) is None  # a baseline, not news
    assert deltas.advance("a", reading(2, 103, 56.0, 12)) == Increments(3, 6.0, 2)
    assert deltas.advance("a", reading(2, 999, 999, 999)) is None  # not newer: a failed scrape
    # restarted: the preemptions went down; the queue count happens to have climbed past
    # the old value, but one counter down resets them all
    assert deltas.advance("a", reading(3, 1, 30.0, 20)) == Increments(1, 30.0, 20)
    assert deltas.advance("a", reading(4, 1, 31.0, 21)) == Increments(0, 1.0, 1)
    deltas.forget_others({"b"})
    assert deltas.advance("a", reading(5, 5, 40.0, 25)) is None  # forgotten: a baseline again


def replica(name: str, routable: bool = True) -> Replica:
    config = GatewayConfig()
    r = Replica.build(name, ReplicaConfig(grpc_url=f"{name}:1", metrics_url="http://x"), config, upstream=object())  # type: ignore[arg-type]
    r.draining = not routable
    return r


def scrape(
    r: Replica,
    at: float,
    kv: float = 0.0,
    capacity: float = 100,
    preemptions: float = 0,
    qsum: float = 0,
    qcount: float = 0,
    waiting: float = 0,
) -> Replica:
    r.load = LoadReading(
        kv_used=kv * capacity,
        kv_capacity=capacity,
        preemptions=preemptions,
        queue_time_sum=qsum,
        queue_time_count=qcount,
        waiting=waiting,
        at=at,
    )
    return r


def test_kv_use_is_the_capacity_weighted_mean_of_fresh_routable_replicas_over_the_window():
    signals = Signals(window_s=10.0, stale_s=3.0)
    a, b, drained, stale = replica("a"), replica("b"), replica("c", routable=False), replica("d")
    scrape(stale, at=90.0, kv=1.0)
    signals.observe(
        [
            scrape(a, 100, kv=0.9, capacity=300),
            scrape(b, 100, kv=0.5, capacity=100),
            scrape(drained, 100, kv=1.0),
            stale,
        ],
        now=100.0,
    )
    assert signals.values(100.0)[KV_USE] == pytest.approx((270 + 50) / 400)
    signals.observe([scrape(a, 105, kv=0.2, capacity=300), scrape(b, 105, kv=0.2, capacity=100)], now=105.0)
    assert signals.values(105.0)[KV_USE] == pytest.approx((0.8 + 0.2) / 2)
    assert signals.values(115.0)[KV_USE] is None  # nothing in the window: no data


def test_queue_time_is_the_mean_of_requests_scheduled_in_the_window_and_preemptions_a_rate_per_replica():
    signals = Signals(window_s=10.0, stale_s=3.0)
    a, b = replica("a"), replica("b")
    signals.observe([scrape(a, 100, preemptions=50, qsum=1000, qcount=100), scrape(b, 100)], now=100.0)
    values = signals.values(100.0)
    # baselines only: no rate yet; nothing scheduled, nothing waiting: no queueing
    assert values[PREEMPTIONS] is None and values[QUEUE_TIME] == 0.0
    # a: 2 requests queued 12 s each, 10 preemptions; b: 6 requests queued 2 s each, 0 preemptions
    signals.observe(
        [scrape(a, 102, preemptions=60, qsum=1024, qcount=102), scrape(b, 102, qsum=12, qcount=6)], now=102.0
    )
    values = signals.values(102.0)
    assert values[QUEUE_TIME] == pytest.approx(36 / 8)
    assert values[PREEMPTIONS] == pytest.approx(10 / 2 / 10.0)  # per replica, per second of window
    # b restarts (its counters drop): its new totals are its increments
    signals.observe(
        [scrape(a, 104, preemptions=60, qsum=1024, qcount=102), scrape(b, 104, qsum=4, qcount=1)], now=104.0
    )
    assert signals.values(104.0)[QUEUE_TIME] == pytest.approx(40 / 9)


def test_a_queue_that_does_not_move_for_a_window_counts_as_waiting_the_whole_window():
    signals = Signals(window_s=10.0, stale_s=3.0)
    a = replica("a")
    # nothing scheduled in the window (the histogram learns of a wait only when it ends)
    for t in range(100, 112):
        signals.observe([scrape(a, t, qsum=50, qcount=5, waiting=3)], now=float(t))
    assert signals.values(111.0)[QUEUE_TIME] == 10.0
    # the queue emptied once in the window: idle, not overloaded
    signals.observe([scrape(a, 112, qsum=50, qcount=5, waiting=0)], now=112.0)
    assert signals.values(112.0)[QUEUE_TIME] == 0.0
    assert Signals(window_s=10.0, stale_s=3.0).values(112.0)[QUEUE_TIME] is None  # no scrape: no data


def test_error_rate_needs_enough_outcomes_in_the_window():
    signals = Signals(window_s=10.0, stale_s=3.0)
    for ok in (False, False, True):
        signals.outcome(ok)
    signals.observe([], now=100.0)
    assert signals.values(100.0)[ERROR_RATE] is None  # 2 of 3 on an idle gateway
    for index in range(MIN_OUTCOMES):
        signals.outcome(index % 5 != 0)
    signals.observe([], now=101.0)
    assert signals.values(101.0)[ERROR_RATE] == pytest.approx((2 + 2) / (3 + MIN_OUTCOMES))
    assert signals.values(111.0)[ERROR_RATE] is None
