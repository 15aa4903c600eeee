"""Serving: the engine built on the thread that then runs its loop.

Why not `LLMEngine(...).start()`: OpenMP gives every thread that starts
parallel work a team of its own, and building the model (weight packing,
kernels) is parallel work. A team left on the building thread plus the loop's
team are more OpenMP threads than cores, and libgomp then stops spinning
between parallel regions for all of them: every layer's kernels wait for their
workers to wake up (measured on the offline workload, loop thread: 16.1 s
built there, 18.7 s built elsewhere)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .config import EngineConfig
from .core.metrics import MetricsSink
from .core.runner_interface import Runner
from .engine import LLMEngine


def launch(
    config: EngineConfig,
    metrics: MetricsSink | None = None,
    on_dead: Callable[[BaseException], None] | None = None,
    make_runner: Callable[[], Runner] | None = None,
) -> LLMEngine:
    """Build an engine (its runner from `make_runner`, by default the model
    runner) on a new thread that then runs its loop; returns it once built, or
    raises what building raised."""
    built: list[LLMEngine] = []
    failed: list[BaseException] = []
    ready = threading.Event()

    def started(engine: LLMEngine) -> None:
        built.append(engine)
        ready.set()

    def build_and_run() -> None:
        try:
            runner = make_runner() if make_runner is not None else None
            engine = LLMEngine(config, runner=runner, metrics=metrics, on_dead=on_dead)
        except BaseException as exc:
            failed.append(exc)
            ready.set()
            return
        engine.run_here(lambda: started(engine))

    threading.Thread(target=build_and_run, name="llm-engine-loop", daemon=True).start()
    ready.wait()
    if failed:
        raise failed[0]
    return built[0]
