"""What the engine reports of itself (`LLMEngine.stats()`): for the adapter's
health answer, the benchmarks and the tests; the Prometheus families are
core/metrics.py's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    running: int
    waiting: int  # scheduler queue + intake not yet drained
    blocks_used: int
    blocks_free: int
    blocks_capacity: int
    steps: int
    preemptions: int  # requests preempted (recomputed later), as llm_preemptions_total
    prefix_cache_hit_tokens: int  # prompt tokens served from the prefix cache, as llm_prefix_cache_hit_tokens_total
    step_seconds: float  # wall time of steps that ran the model
    model_seconds: float  # of which inside the model (RunnerOutput.model_seconds)
    healthy: bool
