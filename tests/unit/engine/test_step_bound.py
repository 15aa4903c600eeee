"""The bound that steers the pacer's ratio (core/step_bound.py): alone, on
made-up step times, then in the scheduler on a fake clock whose paced
steps stray as a noisy machine's do."""
from __future__ import annotations

import pytest

from python_llm.engine.config import ConfigError, EngineConfig
from python_llm.engine.core.step_bound import ADJUST_EVERY, MARGIN, MIN_RATIO, WINDOW, StepBound

from python_llm.engine.core.prefill_pacer import MIN_CHUNK_TOKENS

from test_prefill_pacer import DECODE_S, UNIT_S, chunks_of, paced, start_streams
from test_scheduler import req


def settle(bound: StepBound, spreads: list[float], rounds: int = 40) -> float:
    """Feed steps that take spread x what they were paced for, cycling
    through `spreads`; the ratio the bound ends at."""
    for i in range(rounds * ADJUST_EVERY):
        bound.observe(spreads[i % len(spreads)])
    return bound.ratio


def test_a_quiet_machine_lets_the_ratio_grow_to_the_bound_less_its_margin() -> None:
    bound = StepBound(3.0, 1.25)
    assert settle(bound, [1.0]) == pytest.approx(MARGIN * 3.0 - 1.0, rel=1e-3)


def test_a_noisy_tail_brings_the_ratio_down_until_the_tail_fits() -> None:
    # one step in 8 takes 1.5x what it was paced for: the tail is 1.5
    bound = StepBound(3.0, 1.25)
    ratio = settle(bound, [1.0] * 7 + [1.5])
    assert ratio == pytest.approx(MARGIN * 3.0 / 1.5 - 1.0, rel=1e-3)
    assert (1.0 + ratio) * 1.5 <= 3.0    # the strays themselves within the bound


def test_one_stray_in_a_window_does_not_move_the_tail() -> None:
    bound = StepBound(3.0, 1.25)
    settle(bound, [1.0])
    quiet = bound.ratio
    settle(bound, [1.0] * (WINDOW - 1) + [3.0], rounds=WINDOW // ADJUST_EVERY)
    assert bound.ratio == pytest.approx(quiet)


def test_the_ratio_stays_between_its_floor_and_the_bound() -> None:
    assert settle(StepBound(3.0, 1.25), [10.0]) == MIN_RATIO
    assert StepBound(3.0, 5.0).ratio == 2.0            # a median step at the bound leaves no room
    assert StepBound(1.5, 0.01).ratio == MIN_RATIO
    with pytest.raises(ValueError, match="bound"):
        StepBound(1.0, 1.0)


@pytest.mark.parametrize("value", [-1.0, 0.5, 1.0])
def test_config_takes_zero_or_more_than_one(value: float) -> None:
    with pytest.raises(ConfigError, match="paced_step_bound"):
        EngineConfig(model_dir="unused", paced_step_bound=value)


def noisy_step(sched, runner, clock, decode_s: float, stray: float) -> tuple[list, float]:
    """One step of the fake clock: decode_s if it decodes + 1 ms a prefill unit, times `stray`."""
    out = sched.schedule()
    chunks = out.chunks()
    decodes = any(n == 1 and start > 0 for _, start, n in chunks)
    units = sum(sched.pacer.cost(start, n) for _, start, n in chunks if n > 1)
    step_s = ((decode_s if decodes else 0.0) + UNIT_S * units) * stray
    clock.now += step_s
    sched.update_from_output(out, runner.execute(out))
    return chunks, step_s


@pytest.mark.parametrize("stray,lower", [(1.0, False), (1.6, True)])
def test_the_scheduler_steers_a_long_prompts_pacing_by_the_tail(stray: float, lower: bool) -> None:
    """Every fourth paced step takes `stray` x its time: on a quiet clock
    the ratio grows, on a noisy one it comes down until those steps fit the
    bound; the prompt finishes either way."""
    decode_s = 0.016   # 16 units at ratio 1: chunks above MIN_CHUNK_TOKENS at any ratio the bound picks
    sched, runner, clock = paced(max_num_batched_tokens=64, prefill_time_ratio=1.0, paced_step_bound=3.0)
    for i in range(2):
        sched.add_request(req(f"s{i}", prompt_len=6, max_tokens=110, base=100 * (i + 1)))
    for _ in range(4):
        noisy_step(sched, runner, clock, decode_s, 1.0)
    assert sched.pacing.bound is not None and sched.pacer.ratio == 1.0
    sched.add_request(req("long", prompt_len=760, max_tokens=1, base=5000))   # the KV cache holds 1,024
    steps, seconds = [], []
    while "long" in sched.requests:
        chunks, step_s = noisy_step(sched, runner, clock, decode_s, stray if len(steps) % 4 == 3 else 1.0)
        steps.append(chunks)
        seconds.append(step_s)
    assert (sched.pacer.ratio < 1.0) is lower and sched.pacer.ratio > MIN_RATIO
    assert max(seconds[-16:]) <= 3.0 * decode_s
    assert len(steps) > 4 * ADJUST_EVERY and sum(chunks_of("long", steps)) == 760
    assert all(n >= MIN_CHUNK_TOKENS for n in chunks_of("long", steps)[:-1])


def test_steps_with_unpaced_prefill_do_not_steer() -> None:
    """A short prompt's chunk runs as it comes, however long its step: such
    steps say nothing about what pacing allows."""
    sched, runner, clock = paced(max_num_batched_tokens=64, prefill_time_ratio=1.0, paced_step_bound=3.0)
    start_streams(sched, runner, clock)
    for i in range(3 * ADJUST_EVERY):
        sched.add_request(req(f"short{i}", prompt_len=60, max_tokens=1, base=7000 + 100 * i))
        out = sched.schedule()
        clock.now += 20 * DECODE_S    # far past the bound
        sched.update_from_output(out, runner.execute(out))
    assert sched.pacer.ratio == 1.0


def test_a_fixed_ratio_without_a_bound() -> None:
    sched, _, _ = paced(prefill_time_ratio=1.0, paced_step_bound=0.0)
    assert sched.pacing.bound is None
    sched, _, _ = paced(prefill_time_ratio=0.0, paced_step_bound=3.0)   # no pacing: nothing to steer
    assert sched.pacing.bound is None
