"""This project's engine, offline: every request submitted at once, then
`step()` until all finish (what `LLMEngine.generate_results` does, written out
so that progress can be shown), and its per-step overhead at full batch."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine

from .progress import progress_bar
from .result import MethodResult
from .workload import BenchRequest, total_output_tokens


@dataclass
class EngineBenchSettings:
    model_dir: str
    dtype: str = "float32"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    num_threads: int = 2
    device: str = "cpu"  # "cuda[:N]" on a GPU machine (the PyTorch paths)
    # room for every request at full length at once: a benchmark of
    # throughput, not of preemption
    kv_tokens: int = 32768


@dataclass
class StepOverhead:
    """Pure-decode steps with `batch` sequences running: wall time around
    `engine.step()` minus time inside decoder layers + LM head."""

    batch: int
    steps: int = 0
    wall_ms: list[float] = field(default_factory=list)
    model_ms: list[float] = field(default_factory=list)

    def add(self, wall_s: float, model_s: float) -> None:
        self.steps += 1
        self.wall_ms.append(wall_s * 1e3)
        self.model_ms.append(model_s * 1e3)

    def summary(self) -> dict[str, float]:
        if not self.steps:
            return {"batch": self.batch, "steps": 0}
        overhead = [w - m for w, m in zip(self.wall_ms, self.model_ms)]
        return {
            "batch": self.batch,
            "steps": self.steps,
            "step_ms_mean": statistics.fmean(self.wall_ms),
            "model_ms_mean": statistics.fmean(self.model_ms),
            "overhead_ms_mean": statistics.fmean(overhead),
            "overhead_ms_median": statistics.median(overhead),
        }


def engine_config(settings: EngineBenchSettings) -> EngineConfig:
    return EngineConfig(
        model_dir=settings.model_dir,
        dtype=settings.dtype,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_tokens_in_paged_kv_cache=settings.kv_tokens,
        num_threads=settings.num_threads,
        max_queue_size=0,
        device=settings.device,
    )


def _sampling(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def timed_offline_run(
    engine: LLMEngine,
    workload: list[BenchRequest],
    label: str,
    prefix: str = "bench",
    outputs: dict[str, list[int]] | None = None,
) -> tuple[float, int]:
    """Every request at once, stepped to the end: (seconds, output tokens);
    each request's tokens into `outputs` (by request id) where given."""
    for i, request in enumerate(workload):
        engine.add_request(f"{prefix}-{i}", list(request.prompt_ids), _sampling(request.max_tokens))
    pending = len(workload)
    useful = 0
    with progress_bar(total_output_tokens(workload), label) as bar:
        started = time.perf_counter()
        while pending:
            new_tokens = 0
            for out in engine.step():
                if out.error:
                    raise RuntimeError(f"engine request {out.request_id} failed: {out.error}")
                new_tokens += len(out.new_token_ids)
                pending -= out.finished
                if outputs is not None:
                    outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            useful += new_tokens
            bar.update(new_tokens)
        seconds = time.perf_counter() - started
    expected = total_output_tokens(workload)
    if useful != expected:
        raise RuntimeError(f"engine produced {useful} tokens, {expected} were requested (EOS ignored)")
    return seconds, useful


def warmed_engine(settings: EngineBenchSettings, workload: list[BenchRequest]) -> LLMEngine:
    engine = LLMEngine(engine_config(settings))
    # warm-up: allocators and kernels, outside the timed part (HF gets the same)
    engine.generate_results([(list(workload[0].prompt_ids[:16]), _sampling(4))])
    return engine


def run_engine_offline(
    settings: EngineBenchSettings, workload: list[BenchRequest], overhead_steps: int = 24
) -> MethodResult:
    """Throughput over the whole workload, then (same engine, untimed for
    throughput) the per-step overhead at full batch."""
    engine = warmed_engine(settings, workload)
    steps_before = engine.stats().steps
    outputs: dict[str, list[int]] = {}
    seconds, useful = timed_offline_run(engine, workload, f"engine offline {settings.dtype}", outputs=outputs)
    steps = engine.stats().steps - steps_before
    overhead = measure_step_overhead(engine, workload, settings.max_num_seqs, overhead_steps)
    return MethodResult(
        method=f"engine-{settings.dtype}",
        label="engine offline (all at once)",
        dtype=settings.dtype,
        useful_output_tokens=useful,
        seconds=seconds,
        num_requests=len(workload),
        extra={
            "steps": steps,
            "overhead_at_full_batch": overhead.summary(),
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
        },
        outputs=[outputs.get(f"bench-{i}", []) for i in range(len(workload))],
    )


def measure_step_overhead(
    engine: LLMEngine, workload: list[BenchRequest], batch: int, decode_steps: int
) -> StepOverhead:
    """`batch` sequences (the workload's prompts) prefilled, then `decode_steps`
    pure-decode steps timed one by one; the requests are aborted afterwards.
    A separate phase because in the throughput run the shortest requests end
    before the last prompts are prefilled, leaving few full-batch decode steps."""
    overhead = StepOverhead(batch=batch)
    # the throughput run's prompts: mostly prefix-cache hits now, so this
    # phase's prefill is short; the decode steps it times are unaffected
    prompts = [workload[i % len(workload)].prompt_ids for i in range(batch)]
    ids = [f"overhead-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, prompts):
        # long enough that nobody finishes: early sequences decode while later ones prefill
        engine.add_request(rid, list(prompt), _sampling(decode_steps + 128))
    started: set[str] = set()
    while len(started) < batch:  # prefill (chunked) until every sequence has its first token
        started.update(out.request_id for out in engine.step() if out.new_token_ids)
    with progress_bar(decode_steps, f"step overhead at {batch} seqs", unit="step") as bar:
        for _ in range(decode_steps):
            before = engine.stats()
            if before.running != batch or before.waiting:
                raise RuntimeError(
                    f"overhead phase: {before.running} running, {before.waiting} waiting; "
                    f"expected {batch} running (KV too small?)"
                )
            t0 = time.perf_counter()
            outputs = engine.step()
            wall = time.perf_counter() - t0
            if len(outputs) != batch or any(len(out.new_token_ids) != 1 for out in outputs):
                raise RuntimeError("overhead phase: a step that was not one token for every sequence")
            overhead.add(wall, engine.stats().model_seconds - before.model_seconds)
            bar.update(1)
    for rid in ids:
        engine.abort(rid)
    while engine.num_live_requests():
        engine.step()
    return overhead
