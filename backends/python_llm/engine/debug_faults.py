"""Test-only faults an end-to-end test sets in the engine's config (and so
through Triton's model config): a stall per step (`debug_step_delay_ms`) and
a failing step (`debug_fail_after_steps`). They wrap the runner when the
engine is built, so the step loop itself has no test-only branch."""

from __future__ import annotations

import time

from .config import EngineConfig
from .core.runner_interface import Runner, RunnerModelInfo
from .core.scheduler_output import RunnerOutput, SchedulerOutput


class FaultyRunner:
    """A runner whose steps first stall `delay_s`, and which fails the step
    after `fail_after_steps` ran (0 = never)."""

    def __init__(self, runner: Runner, delay_s: float, fail_after_steps: int) -> None:
        self.runner = runner
        self.delay_s = delay_s
        self.fail_after_steps = fail_after_steps
        self.steps = 0

    @property
    def model_info(self) -> RunnerModelInfo:
        return self.runner.model_info

    @property
    def num_blocks(self) -> int:
        return self.runner.num_blocks

    @property
    def runs_layer_slices(self) -> bool:
        return self.runner.runs_layer_slices

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_after_steps and self.steps >= self.fail_after_steps:
            raise RuntimeError(f"injected failure after {self.steps} steps (debug_fail_after_steps)")
        result = self.runner.execute(scheduled)
        self.steps += 1
        return result


def with_debug_faults(runner: Runner, config: EngineConfig) -> Runner:
    """`runner`, wrapped in the faults `config` asks for (none: as it is)."""
    if not (config.debug_step_delay_ms or config.debug_fail_after_steps):
        return runner
    return FaultyRunner(runner, config.debug_step_delay_ms / 1000.0, config.debug_fail_after_steps)
