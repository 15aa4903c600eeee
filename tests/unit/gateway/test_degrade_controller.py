"""The degradation level over time, on a fake clock: a spike changes
nothing, a sustained signal raises the level one step per enter dwell, calm
lowers it one step per exit dwell, a signal between its exit and enter
thresholds (or oscillating around one) never makes it flap; level 4 only
with a fallback model; each change published and logged with its cause."""

from __future__ import annotations

import logging

import pytest

from gateway.config import DegradationConfig, GatewayConfig, ReplicaConfig, TierConfig
from gateway.degrade import build_degradation
from gateway.degrade.controller import RECOVERED, Controller, Threshold
from gateway.degrade.levels import TierRoles, effective_max_level
from gateway.degrade.signals import ERROR_RATE, KV_USE, QUEUE_TIME
from gateway.fleet.load import LoadReading
from gateway.fleet.replica import Replica
from gateway.ops.metrics import REGISTRY

KV = Threshold(KV_USE, enter=0.9, exit=0.7)
QUEUE = Threshold(QUEUE_TIME, enter=10.0, exit=2.0)


def controller(max_level: int = 3, enter_dwell_s: float = 60.0, exit_dwell_s: float = 180.0) -> Controller:
    return Controller([QUEUE, KV], max_level, enter_dwell_s, exit_dwell_s, now=0.0)


def run(c: Controller, values: dict, start: float, end: float, step: float = 0.5) -> list[tuple[float, int]]:
    """Evaluate every `step` seconds in [start, end); the (time, level) of each change."""
    changes = []
    t = start
    while t < end:
        change = c.evaluate(values(t) if callable(values) else values, t)
        if change is not None:
            changes.append((t, change.after))
        t += step
    return changes


def test_a_sustained_signal_raises_one_step_per_enter_dwell_up_to_the_max():
    c = controller()
    changes = run(c, {KV_USE: 0.95, QUEUE_TIME: 1.0}, 100.0, 400.0)
    assert changes == [(160.0, 1), (220.0, 2), (280.0, 3)]  # then it stays at the max
    assert c.level == 3


def test_calm_lowers_one_step_per_exit_dwell():
    c = controller(enter_dwell_s=10.0, exit_dwell_s=30.0)
    assert run(c, {KV_USE: 0.95}, 0.0, 20.5) == [(10.0, 1), (20.0, 2)]
    # calm from t=21 (no data for the queue: not overload)
    assert run(c, {KV_USE: 0.5, QUEUE_TIME: None}, 21.0, 200.0) == [(51.0, 1), (81.0, 0)]


def test_a_short_excursion_changes_nothing():
    c = controller(enter_dwell_s=60.0)

    def spike(t):
        return {KV_USE: 0.99 if 100 <= t < 159 else 0.3, QUEUE_TIME: 50.0 if t == 200 else 0.5}

    assert run(c, spike, 0.0, 600.0) == []


def test_between_the_thresholds_the_level_holds_in_both_directions():
    c = controller(enter_dwell_s=10.0, exit_dwell_s=10.0)
    assert run(c, {KV_USE: 0.95}, 0.0, 10.5) == [(10.0, 1)]
    # between exit (0.7) and enter (0.9) for ten dwells: no step either way
    assert run(c, {KV_USE: 0.8}, 10.5, 110.0) == []

    # oscillating around the enter threshold: never above for a whole dwell, never calm
    def around_enter(t):
        return {KV_USE: 0.95 if int(t) % 6 < 3 else 0.85}

    assert run(c, around_enter, 110.0, 300.0) == []

    # oscillating around the exit threshold: never calm for a whole dwell
    def around_exit(t):
        return {KV_USE: 0.65 if int(t) % 6 < 3 else 0.75}

    assert run(c, around_exit, 300.0, 500.0) == []
    assert c.level == 1


def test_the_cause_is_the_signal_above_the_longest():
    c = controller(enter_dwell_s=10.0)
    c.evaluate({KV_USE: 0.95}, 0.0)
    change = c.evaluate({KV_USE: 0.95, QUEUE_TIME: 30.0}, 10.0)
    assert change is not None and change.cause == KV_USE and change.held_s == 10.0 and change.direction == "up"
    assert change.values == {KV_USE: 0.95, QUEUE_TIME: 30.0}


def test_retry_after_is_the_earliest_the_level_can_drop_below_shedding():
    c = controller(max_level=3, enter_dwell_s=10.0, exit_dwell_s=30.0)
    run(c, {KV_USE: 0.95}, 0.0, 30.5)  # level 3 at t=30
    assert c.level == 3
    # not calm: 3 → 2 takes a dwell from now, 2 → 1 another
    assert c.seconds_until_below(2, now=35.0) == pytest.approx(60.0)
    c.evaluate({KV_USE: 0.1}, 40.0)  # calm since 40
    assert c.seconds_until_below(2, now=45.0) == pytest.approx(40.0 + 60.0 - 45.0)
    assert c.seconds_until_below(4, now=45.0) == 0.0


def test_thresholds_and_dwells_are_validated():
    with pytest.raises(ValueError, match="must not exceed"):
        Threshold(KV_USE, enter=0.5, exit=0.7)
    with pytest.raises(ValueError, match="negative"):
        Threshold(ERROR_RATE, enter=0.5, exit=-0.1)
    with pytest.raises(ValueError, match="dwell"):
        Controller([KV], 3, -1.0, 10.0, now=0.0)


def test_level_4_needs_a_fallback_model_and_0_turns_it_off():
    assert effective_max_level(GatewayConfig()) == 3
    assert effective_max_level(GatewayConfig(degradation=DegradationConfig(fallback_model="llm_bls"))) == 4
    assert effective_max_level(GatewayConfig(degradation=DegradationConfig(max_level=2, fallback_model="llm_bls"))) == 2
    assert build_degradation(GatewayConfig(degradation=DegradationConfig(max_level=0))) is None
    with pytest.raises(ValueError, match=r"gateway\.degradation\.max_level"):
        effective_max_level(GatewayConfig(degradation=DegradationConfig(max_level=5)))
    with pytest.raises(ValueError, match=r"gateway\.degradation\.max_tokens_cap"):
        build_degradation(GatewayConfig(degradation=DegradationConfig(max_tokens_cap=0)))
    # a dwell shorter than the window would let one sample's whole window of influence raise the level
    with pytest.raises(ValueError, match=r"gateway\.degradation\.window_s"):
        build_degradation(GatewayConfig(degradation=DegradationConfig(window_s=0.0)))
    with pytest.raises(ValueError, match=r"gateway\.degradation\.enter_dwell_s"):
        build_degradation(GatewayConfig(degradation=DegradationConfig(window_s=10.0, enter_dwell_s=5.0)))
    c = controller(max_level=effective_max_level(GatewayConfig()), enter_dwell_s=1.0)
    assert [level for _, level in run(c, {KV_USE: 1.0}, 0.0, 100.0)] == [1, 2, 3]


def test_the_lowest_tier_is_shed_and_the_next_one_streams_in_one_piece():
    tiers = {
        "free": TierConfig(priority=0),
        "trial": TierConfig(priority=0),
        "paid": TierConfig(priority=10),
        "team": TierConfig(priority=10),
        "enterprise": TierConfig(priority=20),
    }
    assert TierRoles.of(tiers) == TierRoles(frozenset({"free", "trial"}), frozenset({"paid", "team"}))
    # one priority for all: shedding it would refuse everyone, so nobody is shed
    same = {"a": TierConfig(priority=1), "b": TierConfig(priority=1)}
    assert TierRoles.of(same) == TierRoles(frozenset(), frozenset({"a", "b"}))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(kv: float, at: float, qsum: float = 0.0, qcount: float = 0.0, preemptions: float = 0.0) -> Replica:
    r = Replica.build("r", ReplicaConfig(grpc_url="r:1", metrics_url="http://r"), GatewayConfig(), upstream=object())  # type: ignore[arg-type]
    r.load = LoadReading(
        kv_used=kv * 100, kv_capacity=100, queue_time_sum=qsum, queue_time_count=qcount, preemptions=preemptions, at=at
    )
    return r


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_one_huge_sample_in_the_window_changes_nothing():
    clock = Clock()
    d = build_degradation(GatewayConfig(degradation=DegradationConfig(window_s=10.0, enter_dwell_s=10.0)), clock)
    assert d is not None
    queued = 0.0
    for tick in range(200):  # 100 s of scrapes, twice a second
        clock.now = 1000.0 + tick * 0.5
        # one request queued 500 s (one huge sample) among requests queued 0.1 s; one KV reading
        # at 100 %; one burst of 500 preemptions (a huge prefill evicting the batch)
        queued += 500.0 if tick == 40 else 0.1
        d.on_load(
            [
                replica(
                    1.0 if tick == 60 else 0.3,
                    clock.now,
                    qsum=queued,
                    qcount=tick + 1,
                    preemptions=500.0 if tick >= 100 else 0.0,
                )
            ]
        )
        assert d.level == 0, f"changed at tick {tick}: {d.values}"


def test_a_change_is_published_and_logged_with_its_cause(caplog: pytest.LogCaptureFixture):
    clock = Clock()
    d = build_degradation(
        GatewayConfig(degradation=DegradationConfig(window_s=2.0, enter_dwell_s=2.0, exit_dwell_s=3.0)), clock
    )
    assert d is not None
    ups = sample("gateway_degradation_changes_total", {"direction": "up", "cause": KV_USE})
    downs = sample("gateway_degradation_changes_total", {"direction": "down", "cause": RECOVERED})
    caplog.set_level(logging.INFO, logger="gateway.degrade")

    def scrape_for(seconds: float, kv: float) -> None:
        end = clock.now + seconds
        while clock.now < end:
            d.on_load([replica(kv, clock.now)])
            clock.now += 0.5

    scrape_for(2.5, 0.97)
    assert d.level == 1 and sample("gateway_degradation_level") == 1.0
    assert sample("gateway_degradation_changes_total", {"direction": "up", "cause": KV_USE}) == ups + 1
    (up,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    fields = up.fields  # type: ignore[attr-defined]
    assert fields["cause"] == KV_USE and fields["value"] == pytest.approx(0.97) and fields["threshold"] == 0.9
    # not "level": the JSON log line's own field (WARNING) must stay
    assert (fields["direction"], fields["to_level"], fields["from_level"]) == ("up", 1, 0) and "level" not in fields
    assert sample("gateway_degradation_signal", {"signal": KV_USE}) == pytest.approx(0.97)
    # calm: the window forgets the high readings, then one exit dwell
    scrape_for(10.0, 0.1)
    assert d.level == 0 and sample("gateway_degradation_level") == 0.0
    assert sample("gateway_degradation_changes_total", {"direction": "down", "cause": RECOVERED}) == downs + 1
    (down,) = [r for r in caplog.records if r.levelno == logging.INFO and "degradation level" in r.getMessage()]
    assert down.fields["direction"] == "down" and down.fields["cause"] == RECOVERED  # type: ignore[attr-defined]
    assert d.describe()["level"] == 0 and d.describe()["signals"][KV_USE]["enter"] == 0.9


def test_a_failing_evaluation_never_breaks_the_scrape_loop(caplog: pytest.LogCaptureFixture):
    d = build_degradation(GatewayConfig())
    assert d is not None
    d.on_load([object()])  # type: ignore[list-item]
    assert d.level == 0 and "evaluating the degradation signals failed" in caplog.text
