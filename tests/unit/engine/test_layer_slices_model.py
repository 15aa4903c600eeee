"""Layer slices on the real model (SmolLM2-135M, the native CPU kernels):
a long prompt cut into slices by the scheduler (paced on the fake clock of
test_layer_slices.py, so the slices do not depend on this machine's speed)
beside decoding streams gets the greedy tokens it gets alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.request import Request
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler import Scheduler
from python_llm.engine.core.scheduler_output import SchedulerOutput
from python_llm.engine.worker.runner import ModelRunner
from tests.unit.engine.seam_messages import step
from tests.unit.engine.test_layer_slices import Harness, start_streams
from tests.unit.engine.test_prefill_pacer import Clock

PROMPT = [(7919 * i) % 40000 + 100 for i in range(700)]


def greedy(rid: str, prompt: list[int], max_tokens: int) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


@pytest.fixture(scope="module")
def runner(model_dir: Path) -> ModelRunner:
    return ModelRunner(EngineConfig(model_dir=str(model_dir), max_tokens_in_paged_kv_cache=4096, num_threads=2))


def config(model_dir: Path, ratio: float) -> EngineConfig:
    return EngineConfig(
        model_dir=str(model_dir),
        max_tokens_in_paged_kv_cache=4096,
        max_num_batched_tokens=128,
        prefill_time_ratio=ratio,
    )


def tokens_of(outputs: list, rid: str) -> list[int]:
    return [t for o in outputs if o.request_id == rid for t in o.new_token_ids]


def test_a_prompt_in_layer_slices_gets_its_tokens_alone(runner: ModelRunner, model_dir: Path) -> None:
    layers = int(runner.model_info.num_layers)
    # alone, no pacing: 128-token chunks through all layers
    alone = Scheduler(config(model_dir, 0.0), runner.num_blocks, 2048)
    alone.add_request(greedy("alone", PROMPT, 4))
    outputs = []
    while alone.has_unfinished_requests():
        out = alone.schedule()
        outputs += alone.update_from_output(out, runner.execute(out))
    runner.execute(step(finished=["alone"]))
    expected = tokens_of(outputs, "alone")

    sched = Scheduler(config(model_dir, 1.0), runner.num_blocks, 2048, num_layers=layers)
    sched.clock = Clock()
    slices: list[SchedulerOutput] = []

    class Recording:
        def execute(self, out: SchedulerOutput):
            if out.layer_slice is not None:
                slices.append(out)
            return runner.execute(out)

    h = Harness(sched, Recording(), sched.clock, measured=True)  # type: ignore[arg-type]
    start_streams(h)
    sched.add_request(greedy("long", PROMPT, 4))
    h.run_until_done("long", max_steps=3000)
    assert len(slices) >= layers, "the prompt never ran in layer slices"
    assert {s.layer_slice.end_layer - s.layer_slice.first_layer for s in slices} <= set(range(1, layers + 1))
    assert tokens_of(h.outputs, "long") == expected
    assert not runner._slice_hidden
    runner.execute(step(finished=["long", *sched.requests]))
