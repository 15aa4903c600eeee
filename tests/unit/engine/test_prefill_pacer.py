"""Prefill pacing (core/prefill_pacer.py): the cost model, the running
estimates, and the scheduler cutting a long prompt's chunks while decodes
run, driven by a fake clock (a step's time is what the test says it is)."""

from __future__ import annotations

import math

import pytest

from python_llm.engine.config import ConfigError, EngineConfig
from python_llm.engine.core.prefill_pacer import (
    DECODE_WINDOW,
    MAX_MARGIN,
    MIN_CHUNK_TOKENS,
    MIN_PACED_SAMPLES,
    PROBE_UNITS,
    SPREAD_SAFETY,
    PrefillPacer,
)
from python_llm.engine.core.scheduler import Scheduler
from python_llm.engine.worker.model_info import attention_parity_context
from tests.unit.engine.engine_fakes import FakeRunner
from tests.unit.engine.test_scheduler import req


# -- the cost model --------------------------------------------------------------
@pytest.mark.parametrize("context", [0.0, 64.0, 3072.0])
def test_max_tokens_inverts_cost(context: float) -> None:
    pacer = PrefillPacer(1.5, context)
    for start in (0, 1, 100, 4000, 8191):
        for n in (1, 2, 7, 16, 100, 513):
            units = pacer.cost(start, n)
            assert pacer.max_tokens(start, units) == n
            assert pacer.max_tokens(start, units - 1e-3) == n - 1
    assert pacer.max_tokens(10, 0.0) == 0


def test_cost_grows_with_position_by_the_parity_context() -> None:
    pacer = PrefillPacer(1.5, 1000.0)
    assert pacer.cost(0, 1) == pytest.approx(1.001)
    # a token at position 2000 costs three tokens at the start: its GEMMs + twice as much attention
    assert pacer.cost(2000, 1) == pytest.approx(3.001)
    assert PrefillPacer(1.5).cost(5000, 10) == 10  # unknown parity: tokens


def test_smollm2_parity_context() -> None:
    config = {"hidden_size": 576, "intermediate_size": 1536, "num_key_value_heads": 3}
    # (576*(576+2*192) + 576*576 + 3*576*1536) / (2*9*64)
    assert attention_parity_context(config, 9, 64) == 3072.0
    assert attention_parity_context({"hidden_size": 576}, 9, 64) == 0.0


# -- the estimates ---------------------------------------------------------------
def budget(pacer: PrefillPacer, num_decodes: int) -> float | None:
    return pacer.plan(num_decodes)[0]


def margin_of(spread: float) -> float:
    """The margin planned with for a spread (>= 1) below MAX_MARGIN."""
    return 1.0 + SPREAD_SAFETY * (spread - 1.0)


def test_no_limit_without_decodes_or_before_a_decode_step_was_seen() -> None:
    pacer = PrefillPacer(1.5)
    assert budget(pacer, 4) is None
    pacer.observe(1.0, 0, 500.0)  # a prompt alone teaches nothing
    assert budget(pacer, 4) is None and pacer.unit_s is None
    pacer.observe(0.1, 4, 0.0)  # decode-only
    assert budget(pacer, 0) is None  # nothing to protect
    assert budget(pacer, 4) == PROBE_UNITS  # unit cost unknown: a probe
    pacer.observe(0.1 + 32 * 0.002, 4, 32.0)
    assert pacer.unit_s == pytest.approx(0.002)
    assert budget(pacer, 4) == pytest.approx(1.5 * 0.1 / 0.002)


def test_decode_time_per_bucket_of_decode_counts() -> None:
    pacer = PrefillPacer(1.0)
    pacer.observe(0.04, 1, 0.0)
    pacer.observe(0.08, 16, 0.0)
    assert pacer.decode_step_s(1) == 0.04
    assert pacer.decode_step_s(20) == 0.08  # 16..31
    assert pacer.decode_step_s(64) == 0.08  # nearest known bucket
    assert pacer.decode_step_s(3) == 0.04
    pacer.observe(0.12, 17, 0.0)  # the median of the bucket's steps
    assert pacer.decode_step_s(16) == pytest.approx(0.10)


def test_one_stalled_decode_step_does_not_move_the_aim() -> None:
    pacer = PrefillPacer(1.0)
    for _ in range(5):
        pacer.observe(0.04, 16, 0.0)
    pacer.observe(0.09, 16, 0.0)  # a full collection, say, just before a long prompt
    assert pacer.decode_step_s(16) == 0.04
    growing = [0.04 + 0.001 * (i + 1) for i in range(DECODE_WINDOW)]
    for seconds in growing:  # decodes slowing as their contexts grow: followed
        pacer.observe(seconds, 16, 0.0)
    assert pacer.decode_step_s(16) == pytest.approx(growing[DECODE_WINDOW // 2])


def test_a_step_faster_than_the_decode_estimate_does_not_make_prefill_free() -> None:
    pacer = PrefillPacer(1.0)
    pacer.observe(0.1, 8, 0.0)
    pacer.observe(0.08, 8, 10.0)  # noise: below the decode-only time
    assert pacer.unit_s == pytest.approx(0.25 * 0.08 / 10)
    assert math.isfinite(budget(pacer, 8))


def test_paced_steps_are_planned_below_the_bound_by_their_spread() -> None:
    pacer = PrefillPacer(1.0)
    for _ in range(DECODE_WINDOW):
        pacer.observe(0.1, 8, 0.0)  # a quiet machine: decode steps at their median
    pacer.observe(0.1 + 10 * 0.01, 8, 10.0)  # learns the unit: 10 ms
    assert pacer.margin() == 1.0
    assert budget(pacer, 8) == pytest.approx(10.0)  # the bound: 2 x 0.1 s, the prefill 0.1 s of it
    for _ in range(MIN_PACED_SAMPLES - 1):
        _, aim_s = pacer.plan(8)
        pacer.observe(1.1 * aim_s, 8, 10.0, aim_s)  # paced steps run 10% over their plan
        assert pacer.margin() == 1.0  # too few to tell yet
    _, aim_s = pacer.plan(8)
    pacer.observe(1.1 * aim_s, 8, 10.0, aim_s)
    assert pacer.margin() == pytest.approx(margin_of(1.1))
    assert pacer.aim_s(8) == pytest.approx(0.2 / margin_of(1.1))
    pacer.observe(0.5, 8, 10.0)  # a short prompt's step: no plan of the pacer's
    assert pacer.margin() == pytest.approx(margin_of(1.1))


def test_the_margin_has_a_cap() -> None:
    pacer = PrefillPacer(2.0)
    for seconds in (0.1, 0.1, 0.1, 0.5, 0.5):  # decode steps 5x their median: load, not noise
        pacer.observe(seconds, 8, 0.0)
    assert pacer.margin() == MAX_MARGIN
    assert pacer.aim_s(8) == pytest.approx(3 * 0.1 / MAX_MARGIN)


def test_ratio_zero_is_off_and_must_not_be_negative() -> None:
    pacer = PrefillPacer(0.0)
    pacer.observe(0.1, 8, 0.0)
    assert budget(pacer, 8) is None
    with pytest.raises(ConfigError, match="prefill_time_ratio"):
        EngineConfig(model_dir="unused", prefill_time_ratio=-1.0)


# -- the scheduler, on a fake clock ----------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


DECODE_S, UNIT_S = 0.010, 0.001  # a decode-only step; a unit of prefill


def paced(attention_context: float = 0.0, **cfg: object) -> tuple[Scheduler, FakeRunner, Clock]:
    cfg = {"max_num_batched_tokens": 64, "max_num_seqs": 8, "prefill_time_ratio": 1.0, **cfg}
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=1024, **cfg)  # type: ignore[arg-type]
    sched = Scheduler(config, 256, 4096, attention_context=attention_context)
    clock = Clock()
    sched.clock = clock
    return sched, FakeRunner(256, 4), clock


def run_step(sched: Scheduler, runner: FakeRunner, clock: Clock, stretch: float = 1.0) -> list[tuple[str, int, int]]:
    """One step whose time is DECODE_S (if it decodes) + UNIT_S per prefill
    unit, times `stretch` (noise)."""
    out = sched.schedule()
    chunks = out.chunks()
    decodes = sum(1 for _, start, n in chunks if n == 1 and start > 0)
    units = sum(sched.pacer.cost(start, n) for _, start, n in chunks if n > 1)
    clock.now += ((DECODE_S if decodes else 0.0) + UNIT_S * units) * stretch
    sched.update_from_output(out, runner.execute(out))
    return chunks


def start_streams(sched: Scheduler, runner: FakeRunner, clock: Clock, n: int = 2, decode_steps: int = 3) -> None:
    for i in range(n):
        sched.add_request(req(f"s{i}", prompt_len=6, max_tokens=200, base=100 * (i + 1)))
    for _ in range(1 + decode_steps):
        run_step(sched, runner, clock)


def chunks_of(rid: str, steps: list[list[tuple[str, int, int]]]) -> list[int]:
    return [n for step in steps for r, _, n in step if r == rid]


def test_long_prompt_is_paced_while_streams_decode() -> None:
    sched, runner, clock = paced()
    start_streams(sched, runner, clock)
    sched.add_request(req("long", prompt_len=200, max_tokens=1, base=5000))
    steps = []
    while "long" in sched.requests:
        steps.append(run_step(sched, runner, clock))
        assert sum(1 for r, _, n in steps[-1] if n == 1) == 2  # both streams decode every step
    # a probe, then chunks costing ratio x the decode step: 1.0 x 10 ms / 1 ms = 10 tokens
    assert chunks_of("long", steps) == [int(PROBE_UNITS)] + [10] * 16 + [8]
    assert sum(chunks_of("long", steps)) == 200


def test_later_chunks_are_shorter_as_attention_grows() -> None:
    sched, runner, clock = paced(attention_context=1000.0, max_num_batched_tokens=512, prefill_time_ratio=4.0)
    start_streams(sched, runner, clock)
    sched.add_request(req("long", prompt_len=1000, max_tokens=1, base=5000))
    steps = []
    while "long" in sched.requests:
        steps.append(run_step(sched, runner, clock))
    chunks = chunks_of("long", steps)[1:-1]
    assert chunks == sorted(chunks, reverse=True) and chunks[0] > chunks[-1] >= MIN_CHUNK_TOKENS
    step_s = [DECODE_S + UNIT_S * sched.pacer.cost(s, n) for step in steps[1:-1] for r, s, n in step if r == "long"]
    assert max(step_s) <= 5 * DECODE_S + 1e-9  # each step within (1 + ratio) x a decode step


def test_short_prompts_and_prompts_alone_keep_the_token_budget() -> None:
    sched, runner, clock = paced()
    sched.add_request(req("alone", prompt_len=200, max_tokens=1, base=5000))
    steps = [run_step(sched, runner, clock) for _ in range(4)]
    assert chunks_of("alone", steps) == [64, 64, 64, 8]  # no decodes: nothing to pace for
    start_streams(sched, runner, clock)
    run_step(sched, runner, clock)
    sched.add_request(req("short", prompt_len=60, max_tokens=1, base=7000))  # fits one step's budget
    assert chunks_of("short", [run_step(sched, runner, clock)]) == [60]


def test_progress_is_at_least_min_chunk_tokens() -> None:
    sched, runner, clock = paced(prefill_time_ratio=0.01)
    start_streams(sched, runner, clock)
    sched.add_request(req("long", prompt_len=100, max_tokens=1, base=5000))
    steps = [run_step(sched, runner, clock) for _ in range(4)]
    assert chunks_of("long", steps) == [int(PROBE_UNITS), MIN_CHUNK_TOKENS, MIN_CHUNK_TOKENS, MIN_CHUNK_TOKENS]


def noisy_long_prompt(ratio: float, prompt_len: int) -> tuple[Scheduler, list[int], list[float]]:
    """Two streams decode for 40 steps, then a long prompt arrives; every
    10th step runs 15% over its time. The long prompt's chunks and the
    times of the steps until it ends."""
    sched, runner, clock = paced(prefill_time_ratio=ratio)
    count = iter(range(10**6))

    def step() -> list[tuple[str, int, int]]:
        return run_step(sched, runner, clock, stretch=1.15 if next(count) % 10 == 9 else 1.0)

    for i in range(2):
        sched.add_request(req(f"s{i}", prompt_len=6, max_tokens=400, base=100 * (i + 1)))
    for _ in range(40):
        step()
    assert sched.pacer.margin() == pytest.approx(margin_of(1.15))  # the decode steps' spread
    sched.add_request(req("long", prompt_len=prompt_len, max_tokens=1, base=5000))
    chunks: list[int] = []
    times: list[float] = []
    while "long" in sched.requests:
        before = clock.now
        chunks += chunks_of("long", [step()])
        times.append(clock.now - before)
    return sched, chunks, times


def test_on_a_noisy_machine_even_the_noisy_paced_steps_keep_the_bound() -> None:
    """Paced steps are planned below the bound (4 x DECODE_S at ratio 3.0)
    by at least the 15% spread, so not even the stretched ones pass it, and
    the prompt still gets the rest."""
    sched, chunks, times = noisy_long_prompt(3.0, 600)
    assert max(times[1:-1]) <= 4 * DECODE_S + 1e-9  # not the probe, nor the prompt's remainder
    # the plan: 4 x 10 ms / the margin, less the 10 ms decode: 1 ms a token
    # (a few less for a few steps after a stretched one: the unit looks dearer)
    planned = int((4 * DECODE_S / margin_of(1.15) - DECODE_S) / UNIT_S)
    assert max(chunks[1:-1]) == planned and min(chunks[1:-1]) >= planned - 4
    assert sched.pacer.margin() == pytest.approx(margin_of(1.15))


def test_steps_at_the_least_progress_do_not_widen_the_margin() -> None:
    """At ratio 0.5 a step may carry 5 ms of prefill, less than
    MIN_CHUNK_TOKENS cost: every chunk runs past its plan, at the floor.
    Those steps say nothing of the plan's spread; counted, each would lower
    the aim, keep the floor and widen the spread, to MAX_MARGIN."""
    sched, chunks, _ = noisy_long_prompt(0.5, 200)
    assert len(chunks) > 16 and set(chunks[1:-1]) == {MIN_CHUNK_TOKENS}
    assert sched.pacer.margin() == pytest.approx(margin_of(1.15))  # the decode steps' own spread, nothing more


@pytest.mark.parametrize(
    "cfg", [{"prefill_time_ratio": 0.0}, {"enable_chunked_context": False, "max_num_batched_tokens": 256}]
)
def test_off_without_ratio_or_chunking(cfg: dict) -> None:
    sched, runner, clock = paced(**cfg)
    start_streams(sched, runner, clock)
    sched.add_request(req("long", prompt_len=200, max_tokens=1, base=5000))
    first = chunks_of("long", [run_step(sched, runner, clock)])
    assert first == [62] if cfg.get("enable_chunked_context", True) else first == [200]
