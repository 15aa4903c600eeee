"""Layer slices (core/layer_slices.py): a long prompt under pacing runs a
few layers of a big chunk per step. The plan, and the scheduler driving a
FakeRunner that checks every slice continues its chunk (and the KV
bookkeeping), on a fake clock: a step takes DECODE_S if it decodes plus
UNIT_S per pacing unit of prefill, a slice its layers' share of its chunk's."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.layer_slices import MIN_SLICE_SHARE, PLAN_FILL, LayerSlicer
from python_llm.engine.core.outputs import RequestOutput
from python_llm.engine.core.prefill_pacer import PrefillPacer
from python_llm.engine.core.request import RequestStatus
from python_llm.engine.core.scheduler import Scheduler
from python_llm.engine.core.scheduler_output import LayerSlice
from tests.unit.engine.engine_fakes import FakeRunner, expected_tokens
from tests.unit.engine.test_prefill_pacer import DECODE_S, UNIT_S, Clock
from tests.unit.engine.test_scheduler import req

LAYERS = 8


@dataclass
class Harness:
    """A scheduler, a FakeRunner with LAYERS layers, the fake clock, every
    step's seconds, and whether the runner reports its slices' seconds."""

    sched: Scheduler
    runner: FakeRunner
    clock: Clock
    measured: bool
    reported_slice_s: float | None = None  # what the layer timers say, when not the fake's truth
    decode_s: float = DECODE_S  # what a step's decodes cost now
    step_times: list[float] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)

    def step(self) -> list[tuple[str, int, int]]:
        return run_step(self)

    def run_until_done(self, rid: str, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if rid not in self.sched.requests:
                return
            self.step()
        raise AssertionError(f"{rid} not done in {max_steps} steps")


def sliced(measured: bool = True, num_layers: int = LAYERS, **cfg: object) -> Harness:
    cfg = {"max_num_batched_tokens": 64, "max_num_seqs": 8, "prefill_time_ratio": 1.0, **cfg}
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=4096, **cfg)  # type: ignore[arg-type]
    sched = Scheduler(config, 1024, 4096, num_layers=num_layers)
    clock = Clock()
    sched.clock = clock
    return Harness(sched, FakeRunner(1024, 4, num_layers=num_layers), clock, measured)


def run_step(h: Harness) -> list[tuple[str, int, int]]:
    sched, runner, clock = h.sched, h.runner, h.clock
    out = sched.schedule()
    chunks = out.chunks()
    decodes = sum(1 for _, start, n in chunks if n == 1 and start > 0)
    layer_slice = out.layer_slice
    slice_s = 0.0
    units = 0.0
    for rid, start, n in chunks:
        if n == 1 and start > 0:
            continue
        cost = sched.pacer.cost(start, n)
        if layer_slice is not None and rid == layer_slice.request_id:
            slice_s = UNIT_S * cost * (layer_slice.end_layer - layer_slice.first_layer) / LAYERS
        else:
            units += cost
    seconds = (h.decode_s if decodes else 0.0) + UNIT_S * units + slice_s
    clock.now += seconds
    h.step_times.append(seconds)
    result = runner.execute(out)
    if layer_slice is not None and h.measured:
        # what the runner's layer timers report
        result.slice_seconds = slice_s if h.reported_slice_s is None else h.reported_slice_s
    h.outputs += sched.update_from_output(out, result)
    return chunks


def start_streams(h: Harness, n: int = 2) -> None:
    for i in range(n):
        h.sched.add_request(req(f"s{i}", prompt_len=6, max_tokens=1000, base=100 * (i + 1)))
    for _ in range(4):
        h.step()


# -- the plan ---------------------------------------------------------------------
def slicer_with_unit_cost(unit_s: float = UNIT_S, layers: int = LAYERS) -> LayerSlicer:
    pacer = PrefillPacer(1.0)
    pacer.unit_s = unit_s
    return LayerSlicer(pacer, layers)


def test_plan_takes_the_biggest_chunk_that_moves_about_the_most_tokens_a_step() -> None:
    slicer = slicer_with_unit_cost()
    # a layer of n tokens costs n / 8 ms: 40 ms x 0.9 buys 288 token-layers a step
    tokens, layers = slicer.plan(0, 500, 0.040)
    assert layers * tokens / LAYERS * UNIT_S <= PLAN_FILL * 0.040 + 1e-12
    per_step = tokens / -(-LAYERS // layers)
    assert per_step >= 0.9 * 288 / LAYERS
    assert (tokens, layers) == (288, 1)  # one layer of 288: as many tokens a step as any, the biggest chunk


def test_plan_is_bounded_by_what_is_available_and_runs_more_layers_then() -> None:
    slicer = slicer_with_unit_cost()
    # 100 tokens through 2 layers a step (25 ms) would take 4 steps; 72 through 4 (36 ms), 2
    assert slicer.plan(0, 100, 0.040) == (72, 4)


def test_plan_makes_progress_on_a_tiny_budget() -> None:
    assert slicer_with_unit_cost().plan(0, 100, 1e-9) == (2, 1)


def test_no_budget_means_the_whole_chunk_in_one_step() -> None:
    assert slicer_with_unit_cost().plan(0, 100, None) == (100, LAYERS)


# -- the scheduler ----------------------------------------------------------------
@pytest.mark.parametrize("measured", [True, False], ids=["layer-timers", "units-only"])
def test_a_long_prompt_advances_in_layer_slices_within_the_pacing_budget(measured: bool) -> None:
    h = sliced(measured)
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=600, max_tokens=2, base=5000))
    first = len(h.step_times)
    steps = []
    while "long" in h.sched.requests and len(steps) < 1000:
        steps.append(h.step())
        assert {r for r, _, n in steps[-1] if n == 1} >= {"s0", "s1"}  # both streams decode every step
    assert "long" not in h.sched.requests
    chunk_tokens = {tokens for _, tokens, _, _ in h.runner.slice_history}
    # chunks far bigger than the 10 tokens a step buys at full depth (1.0 x 10 ms / 1 ms)
    assert chunk_tokens and max(chunk_tokens) >= 30
    # after the probe, every step within (1 + ratio) x a decode step, give or
    # take a tenth of a layer of the biggest chunk
    slack = 0.1 * UNIT_S * max(chunk_tokens) / LAYERS
    assert max(h.step_times[first + 1 :]) <= 2 * DECODE_S + slack + 1e-9
    # the fake prices a token the same in any chunk (the machine does not:
    # that is what slices are for), so here they can only lose the plan's
    # margin against full depth (a probe, then 10 tokens a step), and the
    # rounding of a chunk's last slice
    assert len(steps) <= (1 + (600 - 32) / 10) / PLAN_FILL + 4
    assert h.sched.slicer.slicing is None and not h.runner.slices


def test_a_slice_timed_at_zero_seconds_teaches_nothing() -> None:
    """The runner reports 0 s for a slice whose layers timed no slower than
    the others (the fairness bench on a Zen 5): the slices keep their size
    from the pacer's units, and no step divides by a zero cost (that step
    raised ZeroDivisionError and the engine died)."""
    h = sliced(True)
    h.reported_slice_s = 0.0
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=600, max_tokens=2, base=5000))
    h.run_until_done("long")
    assert h.runner.slice_history and h.sched.slicer.slicing is None
    assert h.outputs[-1].error is None and any(o.request_id == "long" and o.new_token_ids for o in h.outputs)


def test_a_long_prompt_still_advances_when_the_decodes_alone_fill_the_step() -> None:
    """The streams' contexts grow while a long prompt prefills, until their
    decodes alone take more than the (1 + ratio) x decode step the pacer
    aims at (the fairness bench on a Zen 5: 1,900 steps and no first
    token). The slice then keeps MIN_SLICE_SHARE of its share before: 5 ms
    a step here, ~4.5 tokens (8 layers of 1 ms per 8 tokens), not 2 tokens
    every 8 steps."""
    h = sliced(True)
    start_streams(h)
    h.step()  # a decode-only step at DECODE_S: what the pacer aims from
    h.decode_s = 2.5 * DECODE_S  # past the aim of (1 + 1.0) x DECODE_S
    h.sched.add_request(req("long", prompt_len=600, max_tokens=2, base=5000))
    first = len(h.step_times)
    h.run_until_done("long", max_steps=400)
    assert max(h.step_times[first + 2 :]) <= h.decode_s + MIN_SLICE_SHARE * DECODE_S + 0.1 * UNIT_S * 64 + 1e-9


def test_the_whole_prompt_is_computed_once_and_sampled_after_its_last_layer() -> None:
    h = sliced()
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=400, max_tokens=3, base=5000))
    h.run_until_done("long")
    outputs = [o for o in h.outputs if o.request_id == "long"]
    assert [t for o in outputs for t in o.new_token_ids] == expected_tokens("long", 3)
    sampled_at = [entry for step in h.runner.history for entry in step if entry[0] == "long" and entry[3]]
    assert [start + n for _, start, n, _ in sampled_at] == [400, 401, 402]
    # every chunk ran each layer once, in order (the fake checks each slice
    # continues the last; here: each chunk's slices cover all layers)
    by_chunk: dict[int, list[tuple[int, int]]] = {}
    chunk = -1
    for _, _, first, end in h.runner.slice_history:
        if first == 0:
            chunk += 1
        by_chunk.setdefault(chunk, []).append((first, end))
    assert by_chunk
    for layers in by_chunk.values():
        assert layers[0][0] == 0 and layers[-1][1] == LAYERS


def test_preempting_a_request_mid_chunk_drops_its_slices() -> None:
    h = sliced()
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=600, max_tokens=1, base=5000))
    for _ in range(200):
        if "long" in h.runner.slices:
            break
        h.step()
    long = h.sched.requests["long"]
    assert long.slice_tokens and h.sched.slicer.slicing is long
    h.sched.running.remove(long)
    h.sched._preempt(long)
    assert long.status is RequestStatus.PREEMPTED and long.slice_tokens == long.slice_layers_done == 0
    assert h.sched.slicer.slicing is None
    h.run_until_done("long")  # re-admitted from the start; the fake checks its slices again
    assert "long" in h.runner.preempted_ids


def test_one_request_in_slices_at_a_time_and_an_abort_frees_the_slicer() -> None:
    h = sliced()
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=600, max_tokens=1, base=5000))
    h.sched.add_request(req("long2", prompt_len=600, max_tokens=1, base=9000))
    for _ in range(200):
        if "long" in h.runner.slices:
            break
        h.step()
    for _ in range(5):
        h.step()
    assert {rid for rid, *_ in h.runner.slice_history} == {"long"}
    h.sched.abort(["long"])
    assert h.sched.slicer.slicing is None
    h.run_until_done("long2")
    assert {rid for rid, *_ in h.runner.slice_history} == {"long", "long2"}
    assert "long" in h.runner.dropped_ids


def test_without_layers_there_are_no_slices() -> None:
    h = sliced(num_layers=0)  # a runner without layer slices
    start_streams(h)
    h.sched.add_request(req("long", prompt_len=300, max_tokens=1, base=5000))
    while "long" in h.sched.requests:
        h.step()
        assert h.sched._last_output.layer_slice is None


def test_layer_slice_message_is_immutable() -> None:
    layer_slice = LayerSlice("r", 0, 2)
    with pytest.raises(AttributeError):
        layer_slice.first_layer = 1  # type: ignore[misc]
